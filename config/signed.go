package config

import "github.com/ackgate/ackgate/gate"

// checkSignedIdentity keeps SNS routes' identity on fields the SNS signature
// covers. SNS signs MessageId, TopicArn, Subject, Message and Timestamp but
// not MessageAttributes, so a captured genuine message replayed with one
// attribute changed still verifies: if that attribute chose the operation key
// or fed the fingerprint, the replay would be a new operation and a second
// effect. Pub/Sub is different: its push token authenticates the request as
// a whole, attributes included.
func checkSignedIdentity(r *gate.Route, errs *routeErrs) {
	if r.Broker != gate.BrokerSNS {
		return
	}
	if r.Key.Kind == gate.KeyAttribute {
		errs.add("operation_key.kind", "attribute: SNS does not sign MessageAttributes, so a replayed message with a changed attribute would verify and become a new operation; use message_id, or a json_pointer into the signed Message")
	}
	if len(r.Fingerprint.Attributes) > 0 {
		errs.add("fingerprint.attributes", "SNS does not sign MessageAttributes, so a replayed message with a changed attribute would verify with another fingerprint; use data or pointers into the signed Message")
	}
}
