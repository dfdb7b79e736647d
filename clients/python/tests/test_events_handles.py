"""CPU-side checks of kvctl_engine.cuda_events and the engine_event fields of the engine API."""

import os

import pytest

from kvctl_engine import cuda_events

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
DESCRIPTOR = os.path.join(REPO, "core", "daemon", "testdata", "engine.pb")


def test_check_event_handle_names_the_size():
    assert cuda_events.check_event_handle(bytes(64)) == bytes(64)
    for n in (0, 63, 65, 66):
        with pytest.raises(
            ValueError,
            match=rf"is {n} bytes, a CUDA interprocess event handle \(cudaIpcEventHandle_t\) is 64",
        ):
            cuda_events.check_event_handle(bytes(n))


def test_torch_order_without_cuda_is_a_clear_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the GPU test covers it")
    with pytest.raises(cuda_events.StreamOrderError, match="needs a CUDA device"):
        cuda_events.TorchStreamOrder()


def test_cudart_order_without_the_runtime_is_a_clear_error():
    with pytest.raises(cuda_events.StreamOrderError, match="libcudart"):
        cuda_events.CudartStreamOrder(library="/nonexistent/libcudart.so")


def test_cudart_order_without_a_gpu_is_a_clear_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the GPU test covers it")
    # Either the runtime is missing or the driver/device is: both name the cause.
    with pytest.raises(cuda_events.StreamOrderError, match="libcudart|cudaSetDevice"):
        cuda_events.CudartStreamOrder()


def test_engine_event_fields_in_the_engine_api():
    """RegisterRequest.engine_event (30) and RegisterResponse.daemon_event (30) are CudaEvent
    messages of a handle and a device, and round-trip through the wire format."""
    pb2 = pytest.importorskip("google.protobuf.descriptor_pb2")
    from google.protobuf import descriptor_pool, message_factory

    with open(DESCRIPTOR, "rb") as f:
        fds = pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for fd in fds.file:
        pool.AddSerializedFile(fd.SerializeToString())
    req_d = pool.FindMessageTypeByName("kvctl.engine.v1.RegisterRequest")
    resp_d = pool.FindMessageTypeByName("kvctl.engine.v1.RegisterResponse")
    assert req_d.fields_by_name["engine_event"].number == 30
    assert resp_d.fields_by_name["daemon_event"].number == 30
    ev_d = pool.FindMessageTypeByName("kvctl.engine.v1.CudaEvent")
    assert [(f.name, f.number) for f in ev_d.fields] == [("handle", 1), ("device", 2)]

    def cls(d):
        if hasattr(message_factory, "GetMessageClass"):
            return message_factory.GetMessageClass(d)
        return message_factory.MessageFactory(pool).GetPrototype(d)

    handle = bytes(range(64))
    req = cls(req_d)(engine="e", engine_event=cls(ev_d)(handle=handle, device=3))
    back = cls(req_d).FromString(req.SerializeToString())
    assert back.engine_event.handle == handle and back.engine_event.device == 3
    assert not cls(req_d)(engine="e").HasField("engine_event")


class _FakeOrder:
    device = 2

    def register_fields(self):
        return {"handle": bytes(range(64)), "device": self.device}


def test_event_messages_for_the_sdk_client():
    from kvctl_engine._pb import engine_pb2 as pb

    req = pb.RegisterRequest(engine="e", engine_event=cuda_events.engine_event_message(_FakeOrder()))
    assert req.engine_event.handle == bytes(range(64)) and req.engine_event.device == 2
    with pytest.raises(cuda_events.StreamOrderError, match="without daemon_event"):
        cuda_events.daemon_event_handle(pb.RegisterResponse(engine="e"))
    resp = pb.RegisterResponse(engine="e", daemon_event=pb.CudaEvent(handle=bytes(64), device=2))
    assert cuda_events.daemon_event_handle(resp) == bytes(64)
    with pytest.raises(ValueError, match="is 3 bytes"):
        cuda_events.daemon_event_handle(pb.RegisterResponse(daemon_event=pb.CudaEvent(handle=b"abc")))
