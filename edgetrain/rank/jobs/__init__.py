"""The built-in jobs' own parts (network, optimizer, schedule, augmentation); the registry that
names them is edgetrain.shared.jobs, read by the controller without importing TensorFlow."""
