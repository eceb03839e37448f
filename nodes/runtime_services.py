"""The runtime host's model services: /av_infer/load_model, /av_infer/unload_model and
/av_infer/list_models (``av_infer_msgs`` services, off unless ``model_services``).

``av_infer.model_admin`` confines loads to ``model_dirs`` and bounds them; each call is
answered exactly once, a failure with its typed error's code; a load compiles on the
loader thread, so requests and the other services are answered meanwhile.
``ModelServices`` holds the handlers; ``RuntimeNode`` (which inherits them) creates the
services, the callback group and the loader thread, and owns ``admin``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from av_infer_msgs.msg import ModelInfo, Tensor
from av_infer_msgs.srv import ListModels, LoadModel, UnloadModel
from av_infer_nodes.common import ros_text
from rclpy.task import Future as RosFuture

from av_infer import AvInferError, InvalidParameterError
from av_infer import tensor_codec as codec

LOAD_MODEL_SERVICE = "/av_infer/load_model"
UNLOAD_MODEL_SERVICE = "/av_infer/unload_model"
LIST_MODELS_SERVICE = "/av_infer/list_models"


class ModelServices:
    """The model services' handlers, a part of ``RuntimeNode`` (they use its ``p``,
    ``admin``, ``runtime``, ``active``, ``_handoff``, ``_loader``, ``_lock``,
    ``model_info``, ``_loaded_here`` and ``_publish_models``)."""

    def _service_refusal(self) -> tuple[str, str] | None:
        if not self.p["model_services"]:
            return ("services_disabled", "model services are off (parameter model_services)")
        if self.runtime is None or self.admin is None or not self.active:
            return ("inactive", "the runtime host is not active (lifecycle state)")
        return None

    def _serve(self, resp: Any, body: Callable[[Any], None]) -> Any:
        """One model service call, answered exactly once: refused with a typed code while
        the services are off or the host is inactive; ``body(resp)`` fills a success; an
        av_infer error becomes its code (and an unsupported model its operators), anything
        else ``internal_error`` (never raised into rclpy)."""
        refusal = self._service_refusal()
        if refusal is not None:
            resp.code, resp.message = refusal
            return resp
        try:
            body(resp)
        except AvInferError as exc:
            resp.code, resp.message = exc.code, ros_text(str(exc))
            unsupported = getattr(exc, "unsupported", None) or {}
            if hasattr(resp, "unsupported"):
                resp.unsupported = [ros_text(f"{op}: {', '.join(nodes)}")
                                    for op, nodes in unsupported.items()]
        except Exception as exc:  # noqa: BLE001 - answered, never raised into rclpy
            resp.code, resp.message = "internal_error", ros_text(f"{type(exc).__name__}: {exc}")
        return resp

    async def _on_load_model(self, req: LoadModel.Request, resp: LoadModel.Response
                             ) -> LoadModel.Response:
        """Compiles on the loader thread, not the executor's: while a load (seconds of
        compile) runs, requests, images and the other services are still answered. The
        call is answered once, when the load is done: the model's info or its typed error.
        A host cleaned up meanwhile answers ``inactive`` and drops what the load added."""
        refusal = self._service_refusal()
        if refusal is not None:
            resp.code, resp.message = refusal
            return resp
        admin = self.admin
        done: RosFuture = RosFuture()

        def load() -> None:  # on the loader thread
            try:
                shapes = parse_input_shapes(list(req.input_shapes))
                name = req.name or Path(req.path).stem
                precision = req.precision or str(self.p["precision"])
                outcome: Any = admin.load(name, req.path, shapes, pin=bool(req.pin),
                                          precision=precision)
            except Exception as exc:  # noqa: BLE001 - answered by _serve below
                outcome = exc
            if not self._handoff.post(lambda: done.set_result(outcome)):
                done.set_result(outcome)  # destroyed meanwhile: nobody waits on the answer

        self._loader.submit(load)
        # the executor polls this task on every wake-up; the handoff's post wakes it once
        # the result is set (on the executor thread), so nothing spins meanwhile
        outcome = await done
        if self.admin is not admin:  # cleaned up (or reconfigured) while compiling
            if not isinstance(outcome, BaseException):
                try:
                    admin.unload(outcome.name)
                except Exception:  # noqa: BLE001 - the runtime went with the cleanup
                    pass
            resp.code, resp.message = "inactive", "the runtime host was cleaned up during the load"
            return resp

        def answer(resp: LoadModel.Response) -> None:
            if isinstance(outcome, BaseException):
                raise outcome
            resp.success, resp.code = True, "ok"
            resp.message = f"loaded {outcome.name} ({outcome.precision})"
            resp.model = model_info_msg(outcome)
            self._publish_models()
        return self._serve(resp, answer)

    def _on_unload_model(self, req: UnloadModel.Request, resp: UnloadModel.Response
                         ) -> UnloadModel.Response:
        def unload(resp: UnloadModel.Response) -> None:
            self.admin.unload(req.name)
            with self._lock:
                self.model_info.pop(req.name, None)
                if req.name in self._loaded_here:
                    self._loaded_here.remove(req.name)
            resp.success, resp.code, resp.message = True, "ok", f"unloaded {req.name}"
            self._publish_models()
        return self._serve(resp, unload)

    def _on_list_models(self, req: ListModels.Request, resp: ListModels.Response
                        ) -> ListModels.Response:
        def listing(resp: ListModels.Response) -> None:
            resp.models = [model_info_msg(m) for m in self.admin.list()]
            resp.success, resp.code, resp.device = True, "ok", str(self.device)
        return self._serve(resp, listing)


def parse_input_shapes(entries: list[str]) -> dict[str, list[int]] | None:
    """``["input=1,3,224,224", ...]`` -> ``{"input": [1, 3, 224, 224]}`` (None if empty);
    InvalidParameterError for anything else."""
    if not entries:
        return None
    out: dict[str, list[int]] = {}
    for e in entries:
        name, sep, dims = e.partition("=")
        try:
            shape = [int(d) for d in dims.split(",")] if sep else []
        except ValueError:
            shape = []
        if not name or not shape:
            raise InvalidParameterError(f"input_shapes entries are NAME=D1,D2,...; got {e!r}")
        out[name.strip()] = shape
    return out


def model_info_msg(m: Any) -> ModelInfo:
    """A ``model_admin.LoadedModel`` as an ``av_infer_msgs/ModelInfo``."""
    def tensors(spec: dict[str, Any]) -> list[Tensor]:
        return [codec.spec_tensor(Tensor(), n, s, d) for n, (s, d) in spec.items()]

    return ModelInfo(name=m.name, path=m.path or "", inputs=tensors(m.inputs),
                     outputs=tensors(m.outputs), weight_bytes=int(m.weight_bytes),
                     resident_bytes=int(m.resident_bytes), kernels=int(m.kernels),
                     pinned=bool(m.pinned), sha256=m.sha256 or "",
                     plan_cache=m.plan_cache or "", precision=m.precision)
