"""A seeded, pure-Python model of RocketMQ's transactional messaging (no Spark).

It emits the half, op, real and offset event streams of DESIGN §1 with faults injected, and the
ground truth of DESIGN §3, derived from its own state. `reference/rocketmq.md` sections are cited
where a rule comes from it.
"""
