"""Sum ciphers: one contract (`base.SumCipher`: protect, combine, reveal) and its implementations, each in
one file with the protocol that sets it up; `transport.protocols` registers them."""
