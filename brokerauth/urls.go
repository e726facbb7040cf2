package brokerauth

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// snsHostRE is the host of every SNS endpoint, in the commercial and the China
// partitions. No port is allowed: real SNS URLs never carry one.
var snsHostRE = regexp.MustCompile(`^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$`)

// maxURLLen bounds the URLs a message may hand us.
const maxURLLen = 2048

// URLPolicy is the allow-list for URLs that an SNS message asks the gateway
// to fetch: its SigningCertURL and a confirmation's SubscribeURL. The zero
// value trusts only the AWS pattern.
type URLPolicy struct {
	trusted []trustedPrefix
}

type trustedPrefix struct {
	scheme, host, path string
}

// NewURLPolicy trusts, beyond real SNS endpoints, the given URL prefixes, each
// written like http://127.0.0.1:4100/ (scheme, host, optional port and a path
// ending in "/"). They are meant for SNS emulators in tests and development;
// production configurations leave them empty.
func NewURLPolicy(trustedPrefixes []string) (*URLPolicy, error) {
	p := &URLPolicy{}
	var errs []error
	for _, raw := range trustedPrefixes {
		tp, err := parseTrustedPrefix(raw)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p.trusted = append(p.trusted, tp)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// CheckTrustedPrefix validates one configured prefix, for configuration errors
// that say which value is wrong.
func CheckTrustedPrefix(raw string) error {
	_, err := parseTrustedPrefix(raw)
	return err
}

func parseTrustedPrefix(raw string) (trustedPrefix, error) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return trustedPrefix{}, fmt.Errorf("trusted URL prefix %q is not a URL", raw)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "", u.Opaque != "":
		return trustedPrefix{}, fmt.Errorf("trusted URL prefix %q must be an absolute http(s) URL", raw)
	case u.User != nil, u.RawQuery != "", u.Fragment != "", u.ForceQuery:
		return trustedPrefix{}, fmt.Errorf("trusted URL prefix %q must not carry credentials, a query or a fragment", raw)
	case !strings.HasSuffix(u.Path, "/"):
		// Without the slash, http://127.0.0.1:4100 would also trust
		// http://127.0.0.1:41000 and /SimpleNotificationServiceX.
		return trustedPrefix{}, fmt.Errorf("trusted URL prefix %q must end with /", raw)
	case strings.Contains(u.Path, ".."):
		return trustedPrefix{}, fmt.Errorf("trusted URL prefix %q must not contain a .. segment", raw)
	}
	return trustedPrefix{scheme: u.Scheme, host: strings.ToLower(u.Host), path: u.Path}, nil
}

// CheckCertURL accepts a SigningCertURL the gateway may fetch: https on an SNS
// host with a path ending in .pem, or a URL under a trusted prefix that ends
// in .pem.
func (p *URLPolicy) CheckCertURL(raw string) (*url.URL, error) {
	u, err := p.check(raw, "SigningCertURL")
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(u.Path, ".pem") || u.RawQuery != "" || u.ForceQuery {
		return nil, fail(Forbidden, nil, "SigningCertURL must name a .pem file without a query")
	}
	return u, nil
}

// CheckSubscribeURL accepts a SubscribeURL the gateway may GET to confirm a
// subscription: the same hosts as certificates, and a ConfirmSubscription
// action, so that a message can never make the gateway call another action.
func (p *URLPolicy) CheckSubscribeURL(raw string) (*url.URL, error) {
	u, err := p.check(raw, "SubscribeURL")
	if err != nil {
		return nil, err
	}
	q, qerr := url.ParseQuery(u.RawQuery)
	if qerr != nil || len(q["Action"]) != 1 || q.Get("Action") != "ConfirmSubscription" {
		return nil, fail(Forbidden, nil, "SubscribeURL must carry exactly one Action=ConfirmSubscription")
	}
	return u, nil
}

func (p *URLPolicy) check(raw, field string) (*url.URL, error) {
	if raw == "" {
		return nil, fail(Malformed, nil, "%s is missing", field)
	}
	if len(raw) > maxURLLen || strings.ContainsAny(raw, "\\ \t\r\n\x00") {
		return nil, fail(Forbidden, nil, "%s is not an acceptable URL", field)
	}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" || u.Host == "" || u.User != nil || u.Fragment != "" {
		return nil, fail(Forbidden, nil, "%s is not an acceptable URL", field)
	}
	if strings.Contains(u.Path, "..") {
		return nil, fail(Forbidden, nil, "%s must not contain ..", field)
	}
	if u.Scheme == "https" && snsHostRE.MatchString(u.Host) {
		return u, nil
	}
	if p == nil {
		return nil, fail(Forbidden, nil, "%s is not an https URL on an SNS host (sns.<region>.amazonaws.com)", field)
	}
	host := strings.ToLower(u.Host)
	for _, t := range p.trusted {
		if u.Scheme == t.scheme && host == t.host && strings.HasPrefix(u.Path, t.path) {
			return u, nil
		}
	}
	return nil, fail(Forbidden, nil, "%s is not an https URL on an SNS host (sns.<region>.amazonaws.com)", field)
}

// topicARNRE is an SNS topic ARN: arn:PARTITION:sns:REGION:ACCOUNT:NAME,
// as config accepts it for a route's sources.
var topicARNRE = regexp.MustCompile(`^arn:(aws[a-z-]*):sns:([a-z0-9-]+):[0-9]{12}:[A-Za-z0-9_.-]{1,256}$`)

// TopicRegion is the region a topic ARN names, and the host of SNS's
// endpoint there (sns.REGION.amazonaws.com, .amazonaws.com.cn in China);
// ok is false for anything that is not an SNS topic ARN.
func TopicRegion(arn string) (region, host string, ok bool) {
	m := topicARNRE.FindStringSubmatch(arn)
	if m == nil {
		return "", "", false
	}
	host = "sns." + m[2] + ".amazonaws.com"
	if m[1] == "aws-cn" {
		host += ".cn"
	}
	return m[2], host, true
}

// RegionAllowed reports whether topicArn is in a region one of topics (a
// route's topic ARNs) is in. A route fetches certificates only from the
// regions its topics name: a message for another region is refused before
// anything is fetched for it, so messages naming other hosts can never
// spend the fetches of the route's own.
func RegionAllowed(topicArn string, topics []string) bool {
	m := topicARNRE.FindStringSubmatch(topicArn)
	if m == nil {
		return false
	}
	for _, t := range topics {
		if o := topicARNRE.FindStringSubmatch(t); o != nil && o[1] == m[1] && o[2] == m[2] {
			return true
		}
	}
	return false
}

// checkRegionHost refuses a URL on an SNS host other than the endpoint of
// the region topicArn names: SNS signs with, and confirms from, the region
// the topic lives in. URLs under a trusted prefix (an emulator's) are not
// bound to a region.
func checkRegionHost(u *url.URL, topicArn, field string) error {
	if !snsHostRE.MatchString(u.Host) {
		return nil // a trusted prefix: CheckCertURL or CheckSubscribeURL admitted it
	}
	_, want, ok := TopicRegion(topicArn)
	if !ok {
		return fail(Forbidden, nil, "TopicArn is not an SNS topic ARN, so the region of %s cannot be checked", field)
	}
	if u.Host != want {
		return fail(Forbidden, nil, "%s is not on the SNS endpoint of the topic's region (%s)", field, want)
	}
	return nil
}
