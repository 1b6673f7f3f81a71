"""What an image's build arguments leave in it (issue 80, item 8): `--apt-proxy` was a custom build
argument (APT_PROXY) used in a RUN, so its value, credentials included, was in `docker history` on
every node. Docker leaves its predefined proxy arguments (HTTP_PROXY and its family) out of the
history as long as no Dockerfile declares them with ARG; so the proxy travels in HTTP_PROXY, and
no Dockerfile declares any argument named like a proxy.

Read from the files rather than built: an image build takes many minutes, and which arguments Docker
records is Docker's documented behaviour (docs.docker.com, "Predefined ARGs"); what is edgetrain's is
which name the value is passed under and that nothing declares it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edgetrain.controller.images import image_build

ROOT = Path(__file__).resolve().parents[2]
# Docker's predefined build arguments, kept out of `docker history` unless declared.
PREDEFINED = {"HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "FTP_PROXY", "ftp_proxy", "NO_PROXY", "no_proxy",
              "ALL_PROXY", "all_proxy"}


@pytest.mark.parametrize("dockerfile", ["Dockerfile.arm64", "Dockerfile.cuda"])
def test_no_dockerfile_declares_an_argument_named_like_a_proxy(dockerfile):
    declared = re.findall(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)", (ROOT / "images" / dockerfile).read_text(), re.M)
    assert declared and not [a for a in declared if "proxy" in a.lower()], declared


def test_the_apt_proxy_travels_in_a_predefined_argument_that_apt_install_reads():
    assert image_build.PROXY_ARG in PREDEFINED
    assert f'"${{{image_build.PROXY_ARG}:-}}"' in (ROOT / "images" / "apt-install").read_text()
