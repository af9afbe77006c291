"""tandem: exact, fast speculative decoding on the CPU.

    import tandem
    model = tandem.Model("smollm2-135m", threads=2)
    print(model.chat([{"role": "user", "content": "Why is the sky blue?"}], max_tokens=64).text)

``Model`` loads a GGUF file or a catalogue model (fetched on first use);
``generate`` continues raw text, ``chat`` answers a conversation; both
return a ``Completion`` or, with ``stream=True``, a ``Stream`` of text pieces.
A drafter (``drafter=`` a support file, ``lookup=True``) makes generation
speculative: faster where drafts are accepted, the same output always.
"""

from ._tandem import Completion, Model, Stats, Stream, TandemError, __version__

__all__ = ["Model", "Completion", "Stats", "Stream", "TandemError", "__version__"]
