"""What the controller and the ranks both use: the files and events they meet in (run
directories, checkpoints, failure records, progress events, the shipped working directory), the
strategies' names and what each tells every rank of its peers, the job options and the jobs'
registry, datasets, MPICH's Hydra, and errors."""
