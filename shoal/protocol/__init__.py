"""Wire protocol: messages, framing and serialisation. Pure: no I/O, no clocks."""
