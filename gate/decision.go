package gate

// Decision is what the gate tells the broker. Handlers map it to a status code
// per broker; nothing else in the gateway chooses a status.
type Decision string

const (
	// Ack: the effect is confirmed now or earlier, or the message was durably
	// dead-lettered by the gateway.
	Ack Decision = "ack"
	// Nack: send it again later; nothing is lost by answering this.
	Nack Decision = "nack"
	// Reject: a deliberate refusal of a request we never want to see again.
	Reject Decision = "reject"
)
