// Package sqstransport carries events over Amazon SQS (or any server that
// speaks its API, such as LocalStack or fauxqs; AWS_ENDPOINT_URL picks it).
//
// Publisher sends outbox rows with SendMessageBatch, 10 per call and several
// calls in flight, each message carrying the attributes event_id, event_type
// and traceparent.
//
// Subscriber long-polls a queue and hands each decoded envelope to a
// handler. Its contract with the handler:
//   - a message is deleted only after the handler returned nil, that is
//     after the handler's transaction committed (Applied or Duplicate);
//   - a handler error leaves the message in the queue; it comes back after a
//     backoff (its visibility timeout is set from its receive count), and
//     SQS moves it to the DLQ after maxReceiveCount receives;
//   - a body that does not decode, and a handler error that says it is
//     permanent (a Permanent() bool method returning true), parks the message
//     in the queue's DLQ at once, with the reason as a message attribute:
//     never acked silently, never retried in vain;
//   - a handler that panics fails its message like an error (the panic is
//     logged with its stack and the subscriber carries on); a message that
//     still panics on its MaxPanics-th receive is parked with reason panic;
//   - each handler has a deadline below the visibility timeout
//     (HandlerTimeout): past it its context is cancelled, its transaction
//     rolls back and the message is left for redelivery, counted;
//   - while a handler runs, the message's visibility is extended, so a slow
//     handler is not raced by a second copy (unless it hangs past
//     MaxExtension: then a second copy runs, and the dedupe key decides);
//   - with a Gate (pkg/outage), an outage is not poison: a handler error
//     that looks like the database being away and that the gate's probe
//     confirms stops receiving until the probe answers, and the messages in
//     hand are held (visibility extended) and handled again then, costing
//     no receive towards maxReceiveCount; receive errors back off (1 s to 20 s);
//   - every call to SQS has a deadline (a receive WaitTime plus 5 s, the
//     others 5 s), as the SDK's HTTP client has no response timeout: a call
//     that gets no answer fails like one SQS refused (logged; a receive
//     backs off), it does not hang the subscriber;
//   - on shutdown, the current long poll is allowed to finish (at most
//     WaitTime, and 5 s more if its answer never comes: an abandoned poll
//     would hide its messages for a visibility timeout), no new one starts,
//     in-flight handlers finish (up to a grace period) and their messages
//     are deleted; nothing uncommitted is deleted.
package sqstransport
