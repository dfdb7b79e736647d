"""pytest options of the SDK's tests. The package is imported from this checkout."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "vllm: needs vLLM (the environment `make vllmenv` builds); `make pytest-vllm` runs these, "
        "`make pytest-sdk` the others",
    )


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="where the reference engine's tests (test_hf_*) keep the model and the KV pages: cpu "
        "(a sealed memfd) or cuda (a CUDA tensor over CUDA IPC; needs a GPU and a GPU kvctl serve)",
    )


@pytest.fixture(scope="session")
def device(pytestconfig):
    """The --device the reference engine's tests run on."""
    d = pytestconfig.getoption("--device")
    if d == "cuda":
        import torch

        if not torch.cuda.is_available():
            pytest.fail("--device cuda: torch sees no GPU")
    return d
