"""Prompts tokenised a piece at a time: the chat template's markers cut a prompt into pieces, and a
piece tokenised for an earlier prompt is not tokenised again.

Why: every reply renders the whole conversation through the chat template and tokenises it
(ChatEngine.prompt_tokens). llama.cpp's tokeniser reads about 1-2 MB of text a second on these
CPUs, so a history of 6,800 tokens cost 15-20 ms before each reply's first token, and several
times that once the context is full (fit_window counts more than one window). Between two replies
only the newest reply and message are new text.

Exact, by how llama.cpp tokenises (llama-vocab.cpp, `tokenizer_st_partition`): with
parse_special it first cuts the text at every occurrence of a special token's text (control,
user-defined and unknown tokens, longest first), then tokenises each raw piece on its own. A
control token X is a *marker* (`marker`) where every occurrence of its text is cut out whatever
surrounds it:

* no other special token at least as long overlaps X's text (contains it, ends with a start of it
  or starts with an end of it), so none takes an occurrence before X's turn;
* X's text does not overlap itself, and neither starts nor ends with white space (a neighbour's
  lstrip or rstrip only eats white space); X does not lstrip (which would eat the end of the
  piece before it).

Then a text's tokens are the tokens of its part before the first marker, followed by those of
each marker's occurrence with the text up to the next: every piece after a marker starts after a
special token in both (an SPM vocabulary's space prefix follows that), and X's rstrip acts inside
its own piece. Each piece after a marker must come back starting with X, or the prompt is
tokenised whole.

Markers are the safe control tokens found in prompts tokenised whole, so they are the template's
own. Prompts shorter than MIN_BYTES are tokenised whole (about a millisecond). The vocabulary's
scan for its special tokens (18 ms for 49k tokens, 54 ms for 152k, 91 ms for Gemma's 262k on 2
cores) waits for the second long prompt: a first long message's reply never pays it, and in the
chat the second is the history's reading ahead, before the next message.
"""

from __future__ import annotations

from typing import Callable

#: A prompt of fewer bytes is tokenised whole, and teaches no marker.
MIN_BYTES = 4096
#: Tokens of pieces kept, over all pieces: about four contexts of 8k tokens.
KEEP_TOKENS = 32768
_SPACE = b" \t\n\v\f\r"  # C isspace(): what lstrip and rstrip take

Specials = dict[int, tuple[bytes, bool, bool]]  # id -> (text, is a control token, lstrips)


def overlaps(x: bytes, y: bytes) -> bool:
    """Whether text `y` contains `x`, or ends with a start of `x`, or starts with an end of `x`."""
    if x in y:
        return True
    n = min(len(x) - 1, len(y))
    if n <= 0:
        return False
    tail, head = y[len(y) - n:], y[:n]
    at = tail.find(x[:1])
    while at >= 0:  # y's end, from a byte that starts x on
        if x.startswith(tail[at:]):
            return True
        at = tail.find(x[:1], at + 1)
    at = head.rfind(x[-1:])
    while at >= 0:  # y's start, up to a byte that ends x
        if x.endswith(head[:at + 1]):
            return True
        at = head.rfind(x[-1:], 0, at)
    return False


def self_overlapping(x: bytes) -> bool:
    """Whether two occurrences of `x` can overlap (a proper end of `x` is also its start)."""
    return any(x[:k] == x[-k:] for k in range(1, len(x)))


class PromptTokens:
    """Tokenises prompts, reusing the tokens of pieces tokenised before (see the module's
    docstring for why the result equals tokenising the whole text).

    tokenize(data): llama.cpp's tokens of UTF-8 `data` (no BOS added, special tokens parsed).
    specials(): every token llama.cpp cuts a text at, as {id: (text, is a control token, lstrips)};
    asked once, by the second prompt of at least `min_bytes` (the first is tokenised whole)."""

    def __init__(self, tokenize: Callable[[bytes], list[int]], specials: Callable[[], Specials],
                 keep_tokens: int = KEEP_TOKENS, min_bytes: int = MIN_BYTES) -> None:
        self._tokenize = tokenize
        self._specials_of = specials
        self._specials: Specials | None = None
        self._judged: dict[int, bool] = {}  # control token -> whether it is a marker
        self._unlearned: list[int] | None = None  # the first long prompt's tokens, markers not yet taken
        self.markers: dict[bytes, int] = {}  # a marker's text -> its token
        self.keep_tokens = keep_tokens
        self.min_bytes = min_bytes
        self._pieces: dict[bytes, list[int]] = {}  # a piece's bytes -> its tokens; newest last
        self._kept = 0  # tokens over all kept pieces
        self.reused = 0  # tokens taken from kept pieces, over all calls (benchmarks and tests read them)
        self.tokenized = 0  # tokens tokenised anew

    def __call__(self, text: str) -> list[int]:
        data = text.encode("utf-8")
        if len(data) < self.min_bytes or self.keep_tokens <= 0:
            return self._whole(data)
        if self._unlearned is not None:
            self._learn(self._unlearned)
            self._unlearned = None
        tokens = self._by_pieces(data) if self.markers else None
        if tokens is None:
            tokens = self._whole(data)
            if self._specials is None:
                self._unlearned = tokens  # the vocabulary's scan waits for a next prompt to cut
            else:
                self._learn(tokens)
        return tokens

    def marker(self, token: int) -> bool:
        """Whether the text may be cut at every occurrence of `token`'s text (the module
        docstring's rule)."""
        hit = self._judged.get(token)
        if hit is None:
            specials = self._specials_table()
            text, control, lstrips = specials.get(token, (b"", False, False))
            hit = (control and not lstrips and len(text) > 0 and text[:1] not in _SPACE
                   and text[-1:] not in _SPACE and not self_overlapping(text)
                   and not any(other != token and len(y) >= len(text) and overlaps(text, y)
                               for other, (y, _, _) in specials.items()))
            self._judged[token] = hit
        return hit

    # ------------------------------------------------------------------ the pieces
    def _whole(self, data: bytes) -> list[int]:
        tokens = self._tokenize(data)
        self.tokenized += len(tokens)
        return tokens

    def _specials_table(self) -> Specials:
        if self._specials is None:
            self._specials = self._specials_of()
        return self._specials

    def _learn(self, tokens: list[int]) -> None:
        specials = self._specials_table()
        for t in set(tokens):
            if t in specials and t not in self._judged and self.marker(t):
                self.markers[specials[t][0]] = t

    def _cuts(self, data: bytes) -> list[int]:
        """Where the markers' occurrences start, in order (markers never overlap one another)."""
        cuts = []
        for text in self.markers:
            at = data.find(text)
            while at >= 0:
                cuts.append(at)
                at = data.find(text, at + len(text))
        cuts.sort()
        return cuts

    def _by_pieces(self, data: bytes) -> list[int] | None:
        cuts = self._cuts(data)
        if not cuts:
            return None
        tokens: list[int] = []
        reused = tokenized = 0
        bounds = [*cuts, len(data)] if cuts[0] == 0 else [0, *cuts, len(data)]
        for start, end in zip(bounds, bounds[1:]):
            piece = data[start:end]
            got = self._pieces.pop(piece, None)
            if got is not None:
                reused += len(got)
            else:
                got = self._tokenize(piece)
                if start > 0 or cuts[0] == 0:  # a marker starts the piece: it must come back first
                    text = next(t for t in self.markers if piece.startswith(t))
                    if not got or got[0] != self.markers[text]:
                        self._judged[self.markers.pop(text)] = False  # no longer a marker
                        return None  # tokenised whole instead
                tokenized += len(got)
                self._kept += len(got)
                self._learn(got)  # a marker new to this piece cuts the next prompts
            self._pieces[piece] = got  # newest last
            tokens += got
        while self._kept > self.keep_tokens and self._pieces:
            self._kept -= len(self._pieces.pop(next(iter(self._pieces))))
        self.reused += reused
        self.tokenized += tokenized
        return tokens
