"""Reading real RocketMQ: pure decoders of the broker's formats (bytes in, landing records out)."""
