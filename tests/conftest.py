import pytest
import torch

# Tests share the machine's 2 cores with Ray workers and helpers: keep torch to one thread each.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def demo_weights():
    """The demo backbone (pretrained once on clean digits, cached across runs)."""
    from raystudy import engine

    return engine.demo_weights()
