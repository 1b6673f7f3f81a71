"""lab/emulated_bench.py: the concurrent one-node references are the lab's, edgetrain bench's options the product's."""

import pytest

from edgetrain.controller.bench.runner import Reference
from lab import emulated_bench
from tests.conftest import assert_one_line_error, edgetrain, lab_bench


@pytest.mark.parametrize(("argv", "reference", "rest"), [
    (["lenet", "-i", "hosts.yml"], Reference.CONCURRENT, ["lenet", "-i", "hosts.yml"]),
    (["lenet", "--reference", "alone", "--nodes", "1,2"], Reference.ALONE, ["lenet", "--nodes", "1,2"]),
    (["--reference=concurrent", "lenet"], Reference.CONCURRENT, ["lenet"]),
    # After --, the words are the script's own.
    (["./train.py", "--", "--reference", "alone"], Reference.CONCURRENT, ["./train.py", "--", "--reference", "alone"]),
])
def test_the_reference_is_taken_out_and_every_other_word_goes_to_bench(argv, reference, rest):
    assert emulated_bench.split(argv) == (reference, rest)


@pytest.mark.parametrize("argv", [["lenet", "--reference"], ["lenet", "--reference", "both"], ["lenet", "--reference", "--", "x"]])
def test_a_missing_or_unknown_reference_is_refused(argv):
    with pytest.raises(SystemExit, match="alone or concurrent"):
        emulated_bench.split(argv)


def test_the_product_has_no_reference_and_the_lab_hands_bench_the_rest(tmp_path):
    refused = edgetrain("bench", "lenet", "--reference", "concurrent", "--runs-dir", str(tmp_path))
    assert refused.returncode == 2 and "No such option: --reference" in refused.stderr
    # bench's own checks, reached with the lab's option taken out, end in edgetrain's one line.
    assert_one_line_error(lab_bench("lenet", "--reference", "concurrent", "--repeat", "0", "--runs-dir", str(tmp_path)),
                          "--repeat 0 must be at least 1", code=2)
