"""Imports a package no node has (test fixture)."""

import edgetrain_no_such_package  # noqa: F401
