"""The gRPC face of event capture: PubSubBasicInterface (Publish, BatchPublish, PublishStream).

Every answer comes after the events are durable. A request that breaks a rule gets
INVALID_ARGUMENT naming the rule, and nothing of it is written (validation runs before any
append). A PublishStream is a session: when the client closes its side the session's writers are
flushed before the answer (RFC-023's disconnect guarantee); when the client cancels or the
connection drops, the flush still runs, in the background. Subscribe answers UNIMPLEMENTED.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc  # type: ignore[import-untyped]

from resources import stop_signals
from resources.capture.buffer import CaptureBuffer, Publication, PublishRejected
from resources.proto.prism.interfaces import pubsub_basic_pb2 as pb
from resources.proto.prism.interfaces import pubsub_basic_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
MIN_MESSAGE_BYTES = 64 * 1024 * 1024  # gRPC's own default (4 MiB) would refuse a batch of a few large events


def max_message_bytes(max_payload_bytes: int) -> int:
    """The largest request the server reads: any single allowed payload fits with room for its envelope."""
    return max(MIN_MESSAGE_BYTES, max_payload_bytes + 1024 * 1024)


def _publication(request: pb.PublishRequest) -> Publication:
    return Publication(request.topic, request.payload, dict(request.attributes))


class PubSubCapture(pb_grpc.PubSubBasicInterfaceServicer):
    def __init__(self, buffer: CaptureBuffer) -> None:
        self.buffer = buffer
        self._background = ThreadPoolExecutor(max_workers=2, thread_name_prefix="capture-disconnect")

    def _publish(self, requests: list[pb.PublishRequest], context: grpc.ServicerContext) -> list[pb.PublishResponse]:
        try:
            acks = self.buffer.publish([_publication(r) for r in requests])
        except PublishRejected as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except (RuntimeError, OSError) as exc:  # shutting down, or the buffer's disk failed
            context.abort(grpc.StatusCode.UNAVAILABLE, f"events not durable, publish again: {exc}")
        return [pb.PublishResponse(message_id=a.message_id, sequence=a.sequence) for a in acks]

    def Publish(self, request: pb.PublishRequest, context: grpc.ServicerContext) -> pb.PublishResponse:
        return self._publish([request], context)[0]

    def BatchPublish(self, request: pb.BatchPublishRequest,
                     context: grpc.ServicerContext) -> pb.BatchPublishResponse:
        return pb.BatchPublishResponse(responses=self._publish(list(request.requests), context))

    def PublishStream(self, request_iterator: Iterator[pb.PublishRequest],
                      context: grpc.ServicerContext) -> pb.PublishStreamResponse:
        writers: set[str] = set()
        responses: list[pb.PublishResponse] = []
        try:
            for request in request_iterator:
                responses.extend(self._publish([request], context))
                writers.add(request.topic)
        except BaseException as exc:  # a refused request (abort) or the client gone: still a disconnect
            self._background.submit(self._disconnect, writers)
            if isinstance(exc, grpc.RpcError):
                return pb.PublishStreamResponse()
            raise
        if not context.is_active():  # cancelled: nobody waits for the answer, flush in the background
            self._background.submit(self._disconnect, writers)
            return pb.PublishStreamResponse()
        self._disconnect(writers)
        return pb.PublishStreamResponse(responses=responses)

    def _disconnect(self, writers: set[str]) -> None:
        try:
            self.buffer.disconnect(writers)
        except Exception:
            log.exception("capture: disconnect flush of %s failed; the events stay in the durable log", writers)

    def Subscribe(self, request: pb.SubscribeRequest,
                  context: grpc.ServicerContext) -> Iterator[pb.SubscribeResponse]:
        context.abort(grpc.StatusCode.UNIMPLEMENTED,
                      "Subscribe is not implemented: the capture service is write-only (RFC-023); "
                      "read events back with replay")
        return iter(())

    def close(self) -> None:
        self._background.shutdown(wait=True)


def grpc_server(servicer: PubSubCapture, port: int, host: str = "0.0.0.0", workers: int = 64,
                max_message: int = MIN_MESSAGE_BYTES) -> tuple[grpc.Server, int]:
    """A started server for `servicer`; the port it listens on (a free one when `port` is 0)."""
    server = grpc.server(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="capture-grpc"),
                         options=[("grpc.max_receive_message_length", max_message)])
    pb_grpc.add_PubSubBasicInterfaceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise RuntimeError(f"cannot listen on {host}:{port}")
    server.start()
    return server, bound


def serve_until(stop: threading.Event, server: grpc.Server, grace: float = 10.0) -> None:
    stop_signals.wait_for(stop)
    server.stop(grace).wait()
