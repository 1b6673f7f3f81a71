# The two commands a newcomer needs:
#   make train   set up this machine and train LeNet on MNIST with 4 MPI ranks
#   make test    set up this machine (and what the tests need, torch among it) and run every test
VENV ?= .venv
NP ?= 4
EPOCHS ?= 1
# System packages the tests need on top of the training stack: the multi-node testbed
# (network namespaces, sshd, Slurm and munge for its scheduler test) and the image builds (Docker engine, debootstrap).
TEST_SYSTEM_PACKAGES = iproute2 openssh-server python3-apt docker.io debootstrap sudo strace munge slurmd slurmctld slurm-client
# The suite in two lanes, the testbed's tests in one and the rest in the other (tests/conftest.py
# says why); TEST_LANES= runs it in one.
TEST_LANES ?= -n 2

.PHONY: setup train test test-arm64 test-cuda

setup:
	scripts/setup

train: setup
	$(VENV)/bin/edgetrain run lenet --np $(NP) --epochs $(EPOCHS)

test:
	EDGETRAIN_TORCH=1 EXTRA_SYSTEM_PACKAGES="$(TEST_SYSTEM_PACKAGES)" scripts/setup
	$(VENV)/bin/python -m pytest $(TEST_LANES) $(PYTEST_ARGS)

# The arm64 (Raspberry Pi 4) image, built and checked under qemu emulation: hours on 2 cores.
test-arm64:
	EXTRA_SYSTEM_PACKAGES="$(TEST_SYSTEM_PACKAGES) qemu-user-static binfmt-support" scripts/setup
	mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
	update-binfmts --enable qemu-aarch64
	$(VENV)/bin/python -m pytest -m arm64 tests/images $(PYTEST_ARGS)

# The CUDA image (TensorFlow's CUDA 12.2 wheels, Horovod with NCCL), built offline and checked
# without a GPU; see docs/gpu.md for its build time and size.
test-cuda:
	EXTRA_SYSTEM_PACKAGES="$(TEST_SYSTEM_PACKAGES)" scripts/setup
	$(VENV)/bin/python -m pytest -m cuda tests/images $(PYTEST_ARGS)
