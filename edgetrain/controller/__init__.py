"""What runs on the controller - the machine where you type ``edgetrain``: the CLI, the inventory
and placement, what each strategy asks of the hosts, every check, shipping, the runtimes and
their containers, ``mpirun`` and its supervision, blame, collect, bench and the images. It never
imports code that runs in a rank; the two sides meet in ``edgetrain.shared``."""
