"""A multi-node testbed of network-namespace hosts, and the provisioning tests that use it."""
