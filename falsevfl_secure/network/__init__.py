"""The network between roles: gRPC links with mutual TLS, byte framing, the active party's hub and its relay,
liveness and round deadlines, the signed set-up (agreement, handshake), and the sealed pair channel between
passive parties. It carries tagged byte frames under the bounds its user declares; it knows nothing of rounds'
meaning, tensors or methods, and policy (such as the two-party rule) is passed in."""
