"""raystudy/train/network.py: the interface a node's collectives use (the cross-host trial itself
is tests/test_many_hosts.py's)."""

from raystudy.train import network


def test_the_interface_of_an_address_is_the_one_holding_it():
    assert network.interface_of("127.0.0.1") == "lo"
    assert network.interface_of("192.0.2.254") is None  # TEST-NET-1: on no interface here


def test_the_trainers_backend_pins_collectives_before_the_process_group_forms():
    from ray.train.torch import TorchConfig
    from ray.train.torch.config import _TorchBackend

    config = network.torch_config()
    assert isinstance(config, TorchConfig) and config.backend is None  # gloo on CPU, NCCL on GPU, as before
    backend = config.backend_cls()
    assert isinstance(backend, _TorchBackend) and type(backend).on_start is not _TorchBackend.on_start
