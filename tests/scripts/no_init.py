"""Trains nothing and never calls hvd.init() (test fixture)."""

print("hello from a script without Horovod", flush=True)
