"""What fleetledger adds to vLLM's worker, inside the engine process (``worker_extension_cls``).

vLLM loads this class into its worker by dotted name and calls its methods through
``collective_rpc``. It must import nothing heavy: it runs in ``VLLM::EngineCore``, not
in the Ray actor.

Why the weights travel as a file: with ``AsyncLLM`` the engine runs in a child process
and ``collective_rpc`` arguments are serialised, which tensors do not survive. The
shard's actor receives the refit over the communicator, writes the tensors once to a
safetensors file in the run's own directory, and this method reloads them in place.
``load_weights`` cannot be used after start on CPU (the kernels repack the weights:
``... into parameter (torch.Size([0]))``); ``reload_weights`` with an iterator of
checkpoint-named tensors works, on CPU and GPU alike.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WeightReload"]


class WeightReload:
    """Mixed into vLLM's worker class by vLLM itself."""

    def fleetledger_reload(self, path: str) -> int:
        """Reload every weight from the safetensors file at ``path``; the tensor count."""
        from safetensors.torch import load_file

        tensors = load_file(path)
        worker: Any = self
        worker.reload_weights(weights_iterator=iter(tensors.items()))
        return len(tensors)
