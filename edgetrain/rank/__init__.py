"""What runs inside a rank (or its node's container): the worker around every program, each
strategy's set-up of a rank, the built-in jobs' training recipe, Horovod's Gloo rendezvous, the
MPI probes, the container's lease. A user's script imports the public API beside this package:
``edgetrain.callbacks``, ``edgetrain.gpu``, ``edgetrain.optimizers``, ``edgetrain.tracing``."""
