package adminapi

import "time"

// SubscriptionEvent is one SNS SubscriptionConfirmation or
// UnsubscribeConfirmation and what the gateway did with it. It is evidence
// kept for operators, like Record, and sits in this package for the same
// reason: the SNS handler writes it and storage keeps it, and neither imports
// the other.
type SubscriptionEvent struct {
	ID              int64     `json:"id"`
	Route           string    `json:"route"`
	TopicArn        string    `json:"topic_arn"`
	MessageType     string    `json:"message_type"`
	MessageID       string    `json:"message_id"`
	Outcome         string    `json:"outcome"`
	Reason          string    `json:"reason,omitempty"`
	SubscriptionArn string    `json:"subscription_arn,omitempty"`
	ReceivedAt      time.Time `json:"received_at"`
}

// Outcomes of an SNS subscription message.
const (
	// SubscriptionConfirmed: the SubscribeURL was requested and answered 2xx.
	SubscriptionConfirmed = "confirmed"
	// SubscriptionRefused: the topic is not one the route accepts; nothing
	// was requested.
	SubscriptionRefused = "refused"
	// SubscriptionConfirmFailed: the confirmation could not be made now; SNS
	// is told to send it again.
	SubscriptionConfirmFailed = "confirm_failed"
	// SubscriptionRecorded: an unsubscribe confirmation, kept and not acted on.
	SubscriptionRecorded = "recorded"
)

// SubscriptionClaim is the answer to a claim on one subscription message
// (route and MessageId): whether this copy acts on it, or how an earlier
// copy settled it.
type SubscriptionClaim struct {
	// Owned: this copy handles the message and must settle it.
	Owned bool
	// Outcome and Reason are an earlier copy's settled outcome when not
	// Owned; Outcome is empty while another copy is handling it.
	Outcome string
	Reason  string
	// Route, MessageID and Owner name the claim when it is settled.
	Route, MessageID, Owner string
}
