// Package history records what the hosts of a run were told by their store
// (every grant, every retirement, each with the client-side times of the
// call and its reply) and checks the record, with porcupine, against a
// sequential model of one budget: in-flight per class and open bodies
// never above their ceilings, starts within the token bucket, and grants
// in arrival order per domain. The fault suite in test/ records its load
// and failover scenarios with it; like that suite it builds on Linux only.
package history
