"""Type stubs of tandem's native module."""

import os
from typing import Iterator, Literal, Mapping, Optional, Sequence, Union, overload

__version__: str

class TandemError(Exception):
    """A model, support file or generation that failed."""

class Stats:
    """The numbers of one generation."""

    prompt_tokens: int
    prefill_tokens: int
    generated_tokens: int
    prefill_ms: float
    decode_ms: float
    decode_tps: float
    cycles: int
    drafted: int
    accepted: int
    @property
    def acceptance(self) -> float: ...

class Completion:
    """A finished generation."""

    text: str
    tokens: list[int]
    stop: Literal["eog", "length", "context", "cancelled"]
    stats: Stats

class Stream(Iterator[str]):
    """Text pieces of a generation as they are made."""

    def __iter__(self) -> "Stream": ...
    def __next__(self) -> str: ...
    def close(self) -> None: ...
    @property
    def completion(self) -> Optional[Completion]: ...
    def __enter__(self) -> "Stream": ...
    def __exit__(self, *exc: object) -> bool: ...

Message = Mapping[str, str]
Prompt = Union[str, Sequence[int]]

class Model:
    """A language model, loaded once, that generates from raw text or a chat."""

    def __init__(
        self,
        model: Union[str, os.PathLike[str], None] = None,
        *,
        threads: Optional[int] = None,
        ctx: Optional[int] = None,
        drafter: Union[str, os.PathLike[str], None] = None,
        lookup: bool = False,
        max_draft: Optional[int] = None,
    ) -> None: ...
    @property
    def ctx(self) -> int: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def drafter(self) -> Optional[str]: ...
    @property
    def sessions_in_use(self) -> int: ...
    def tokenize(self, text: str) -> list[int]: ...
    def detokenize(self, ids: Sequence[int]) -> str: ...
    def render_chat(self, messages: list[Message]) -> str: ...
    @overload
    def generate(
        self,
        prompt: Prompt,
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        seed: Optional[int] = None,
        stream: Literal[False] = False,
        speculative: bool = True,
    ) -> Completion: ...
    @overload
    def generate(
        self,
        prompt: Prompt,
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        seed: Optional[int] = None,
        stream: Literal[True],
        speculative: bool = True,
    ) -> Stream: ...
    @overload
    def chat(
        self,
        messages: list[Message],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        seed: Optional[int] = None,
        stream: Literal[False] = False,
        speculative: bool = True,
    ) -> Completion: ...
    @overload
    def chat(
        self,
        messages: list[Message],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        seed: Optional[int] = None,
        stream: Literal[True],
        speculative: bool = True,
    ) -> Stream: ...
