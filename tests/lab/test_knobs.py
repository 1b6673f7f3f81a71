"""lab/knobs.py's inventory copies: the variable set where the inventory sets the ranks' environment."""

import yaml

from lab import knobs


def test_the_value_goes_into_every_mpi_env_the_inventory_sets_and_keeps_the_rest():
    text = """all:
  children:
    cluster:
      vars:
        edgetrain_mpi_env:
          UCX_TLS: tcp,self
      hosts:
        node1: {ansible_host: 198.18.0.11}
        node2: {ansible_host: 198.18.0.12, edgetrain_mpi_env: {HOROVOD_CYCLE_TIME: "1"}}
"""
    inv = yaml.safe_load(knobs.with_env(text, "HOROVOD_CYCLE_TIME", "20"))
    cluster = inv["all"]["children"]["cluster"]
    assert cluster["vars"]["edgetrain_mpi_env"] == {"UCX_TLS": "tcp,self", "HOROVOD_CYCLE_TIME": "20"}
    # A host's own setting would win over the group's: it gets the value too.
    assert cluster["hosts"]["node2"]["edgetrain_mpi_env"] == {"HOROVOD_CYCLE_TIME": "20"}
    assert cluster["hosts"]["node1"] == {"ansible_host": "198.18.0.11"}


def test_an_inventory_without_one_gets_it_for_all_hosts():
    inv = yaml.safe_load(knobs.with_env("all:\n  hosts:\n    node1: {}\n", "HOROVOD_FUSION_THRESHOLD", "0"))
    assert inv["all"]["vars"]["edgetrain_mpi_env"] == {"HOROVOD_FUSION_THRESHOLD": "0"}
    assert inv["all"]["hosts"] == {"node1": {}}


def test_a_script_option_goes_after_the_scripts_separator_once():
    assert knobs.with_option(["--strategy", "torch"], "--bucket-cap-mb", "5") == ["--strategy", "torch", "--", "--bucket-cap-mb", "5"]
    assert (knobs.with_option(["--strategy", "torch", "--", "--epochs", "2"], "--comm-hook", "fp16")
            == ["--strategy", "torch", "--", "--epochs", "2", "--comm-hook", "fp16"])


def test_a_script_without_evaluations_is_read_by_the_last_rate_rank_0_printed(tmp_path):
    from edgetrain.shared import runs

    run = runs.Run(tmp_path)
    assert knobs.logged_rate(run) is None  # no log: no figure
    run.log(0).write_text("epoch 1/2: loss 0.4120, 12,345 img/s on 3 ranks\n"
                          "epoch 2/2: loss 0.1210, 1,234.5 img/s on 3 ranks\ntest accuracy 0.9712\n")
    assert knobs.logged_rate(run) == 1234.5


def test_a_figure_a_run_did_not_give_is_a_dash_not_zero():
    assert [knobs._figure(v) for v in (None, 0, 1183.4)] == ["-", "-", "1,183"]
