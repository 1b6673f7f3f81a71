"""`edgetrain bench`: does adding nodes pay? Measured on the cluster, and predicted before it is measured.

On any inventory, one rank per node, under the run's strategy (Horovod, or torch's DDP for a torch
script with ``--strategy torch``):
  (a) the strategy's allreduce between 2..N nodes at the job's gradient size (and an 8-byte one, for
      latency), wall and CPU seconds per operation (its ``probe``: Horovod's, or torch.distributed's);
  (b) the job on one node: img/s, and the time to the target accuracy;
  (c) the job on each N, ``--repeat`` times, interleaved (1, 2, .. N, 1, 2, ..), try k seeded
      ``--seed`` + k - 1 at every N: the median img/s, E(N) = R(N) / (N R(1)), the share of a step
      above one node's (what allreduce and waiting add), and the time to the target accuracy.
      With concurrent references (the lab's bench of emulated nodes asks for them), R(1) at each N
      is N one-node runs at once, one on each of the N nodes: nodes that share a machine then give
      the reference the same neighbours as the N-node run;
  (d) before any multi-node run, E(N) predicted from (a) and (b): a rank's step is one node's
      compute time plus what of the allreduce (as measured on these nodes, so its CPU cost on a
      slow node is in it, not only the link) and of Horovod's cycle (DDP has none) the backward pass does not
      hide, over the steps it is shared by (``--sync-every``; syncing weights, nothing of it hidden:
      the average is taken between steps), plus the CPU the
      communication takes from the training (its CPU seconds over the cores one node's training
      keeps busy: on a node whose training fills its CPU, a hidden allreduce still costs its CPU).
      A band - nothing hidden and every CPU second of communicating taken from the training, all
      of it hidden on CPU the training leaves idle - and inside it the estimate: for a built-in job,
      from when backprop produces each gradient (``edgetrain.controller.overlap``); for a script,
      half of the allreduce hidden. Both estimates pay the CPU. Printed, then set beside the
      measurement;
  (s) with ``--sync-candidates K1,K2,..``: at every N > 1, E(N) predicted for each K in both modes
      (``edgetrain.shared.sync``) from (a) and (b), and the best-predicted K of each mode measured
      right after the N-loop's own try at that N, in every try (so the candidates share the
      N-loop's hour and seed); once the loop is done, the choice at the largest N - the shortest
      median time to the target, or without one the most img/s - recorded in ``bench.json`` for
      ``edgetrain run --sync-every auto``;
  (t) once the loop is done, each node's own rate for ``run --batch-by speed``: a short one-node
      run (a job's first ``TIMING_STEPS`` steps; a script as given) on each node in turn, unless
      only the first node was benched or concurrent references timed every node; then whether
      batches by speed pay on those nodes (``model.choose_batches``: equal batches wait for the
      slowest node at every step), recorded in ``bench.json`` for ``run --batch-by auto``;
  (e) ``bench.json`` and a plot (``bench.svg``, edgetrain.controller.plots) in ``<runs dir>/<bench id>/``; every run it made
      is an ordinary run directory beside it.

Every measurement is a real ``edgetrain run`` (prepare and execute), so what it measures is what
users get.

The package: ``model`` (the prediction, pure functions of measured numbers), ``record`` (bench.json,
written and read back), ``runner`` (the runs that measure).
"""
