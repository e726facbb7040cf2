// Package console is the operator console: the evidence record, the lanes
// and the routes' contracts as web pages, and the two operator actions
// (resolve an indeterminate operation, replay a terminal one), served under
// /console/ on the admin listener.
//
// It earns a package of its own because it is a different kind of client
// than the JSON admin API beside it: a person in a browser, who logs in once
// and then sends cookies, which brings sessions, CSRF tokens and a
// Content-Security-Policy that a bearer-token API has no use for. Keeping
// that here leaves package handlers a thin JSON adapter and keeps the
// browser's security model in one place. The console decides nothing about
// evidence itself: it reads the ledger through the read model below and
// changes it only through gate.Gate.Resolve, under the same rules as every
// other caller.
//
// Pages are html/template files embedded in the binary, styled by one
// embedded stylesheet; there is no script at all, so the policy can forbid
// every script source. The gateway runs without internet, so nothing is
// fetched from elsewhere.
package console
