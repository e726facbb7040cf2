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
