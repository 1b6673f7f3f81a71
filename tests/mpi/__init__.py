"""Real MPICH, TensorFlow and torch processes on this machine (marker mpi): mpirun, Horovod, Gloo."""
