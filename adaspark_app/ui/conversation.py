"""The open conversation as data: its turns, settings and edit state, and the requests its replies
are asked with.

No Textual: the chat screen shows a `Conversation` and sends the `ReplyRequest`s it builds; the
store (`adaspark_app.store.Store`, or anything with its conversation methods) is given to it, so
it is tested on a real SQLite file alone. Everything here runs on the UI thread.

Regenerate and edit never branch: a request says which turns it keeps (`base`) and the store id
of the first one it replaces (`replace_from`); `record` swaps them for the new turns in one store
transaction, once the reply has ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from markdown_it import MarkdownIt

from ..engine.events import ReplyResult, RoundEvent
from ..engine.sampling import SamplingSettings
from ..errors import AdaSparkError
from ..store import title_from
from ..store.owner import this_owner
from ..thinking import answer_of
from ..wording import counted
from .chat_settings import DEFAULT_MAX_TOKENS, ChatSettings

MAX_TOKENS = DEFAULT_MAX_TOKENS  # per reply; the engine stops earlier at the end-of-generation token
ROLES = ("system", "user", "assistant")  # the stored rows a conversation shows (others are skipped)
NOTHING_TO_REGENERATE = "No reply to regenerate yet."


class ConversationStore(Protocol):
    """The store's conversation methods a `Conversation` uses (`adaspark_app.store.Store` has them)."""

    def create_conversation(self, title: str, model: str, system: str | None = None,
                            settings: dict | None = None) -> str: ...

    def set_conversation_settings(self, conversation_id: str, system: str | None,
                                  settings: dict | None) -> None: ...

    def get_conversation(self, conversation_id: str) -> dict | None: ...

    def get_messages(self, conversation_id: str) -> list[dict]: ...

    def replace_messages_from(self, conversation_id: str, first_id: int | None,
                              messages: list[tuple[str, str, dict | None]]) -> list[int]: ...

    def delete_conversation(self, conversation_id: str) -> None: ...

    def begin_reply(self, conversation_id: str, prompt: str | None, replace_from: int | None,
                    meta: dict, owner: str) -> int: ...

    def update_reply(self, reply_id: int, content: str, meta: dict) -> None: ...

    def end_reply(self, reply_id: int) -> None: ...

    def settle_reply(self, reply_id: int, messages: list[tuple[str, str, dict | None]]) -> list[int] | None: ...


class ChatStore(ConversationStore, Protocol):
    """All the store's conversation methods the chat uses, the conversations list's too."""

    def list_conversations(self, search: str | None = None) -> list[dict]: ...

    def rename_conversation(self, conversation_id: str, title: str) -> None: ...

    def save_draft(self, conversation_id: str | None, text: str) -> None: ...

    def draft(self, conversation_id: str | None) -> str: ...

    def replies_in_flight(self) -> list[dict]: ...


class Refusal(Exception):
    """A request the conversation cannot make as it is; the message says why, for the user."""


@dataclass
class Turn:
    """One message of the conversation: its role and text, its store id (None: the store refused
    it) and, for a reply, the meta stored with it (`reply_meta`)."""

    role: str
    content: str
    id: int | None = None
    meta: dict[str, Any] | None = None


@dataclass
class ReplyRequest:
    """One reply to ask of the engine, and where it is in its life (UI thread)."""

    conversation_id: str
    messages: list[dict[str, str]]  # what the engine is sent: system prompt, kept turns, the new user message
    prompt: str  # the user message the reply answers (a regenerate's: the last one kept)
    turn: int
    created_conversation: bool  # the conversation was created for this prompt
    max_tokens: int = MAX_TOKENS
    request_id: int = 0  # the engine client's number for it
    base: list[dict[str, str]] = field(default_factory=list)  # the turns kept before this one
    regenerate: bool = False  # a new reply to the last user message (no new user message)
    replace_from: int | None = None  # store id of the first message this reply replaces
    edit_index: int | None = None  # the history index of the edited user message
    sampling: SamplingSettings | None = None  # the settings (and seed, if fixed) of this reply
    sent: bool = False  # asked of the engine (after the first paint of its messages)
    in_flight: int | None = None  # its row among the store's replies in flight (None: not written)
    stop_before_send: bool = False  # Esc came before the request was sent

    @property
    def keep(self) -> int:
        """How many turns of the conversation this reply keeps; those after it are replaced."""
        return len(self.base)

    def given_back(self) -> str:
        """The end of a notice that this reply did not happen."""
        if self.regenerate:
            return "the previous reply is kept."
        return "your message is back in the box."


@dataclass
class Stored:
    """A stored conversation as read, before it is shown (`Conversation.read`, `Conversation.show`)."""

    row: dict[str, Any] | None
    messages: list[dict[str, Any]]


class Conversation:
    """The open conversation: its store id (None until its first message is sent), its turns,
    its `ChatSettings`, the context its last reply took, and the user turn being edited."""

    def __init__(self, store: ConversationStore, settings: ChatSettings) -> None:
        self.store = store
        self.id: str | None = None
        self.turns: list[Turn] = []
        self.settings = settings
        # tokens of the context the last reply's prompt and text took (the header shows it
        # against n_ctx); None: not known (a conversation stored before it was recorded)
        self.context_used: int | None = 0
        self.editing: int | None = None  # the index of the user turn being edited
        self.draft = ""  # what the message box held before editing began (given back when it ends)

    # ------------------------------------------------------------------ what it holds
    @property
    def history(self) -> list[dict[str, str]]:
        """The turns as the engine takes them (the system prompt is the settings', not a turn)."""
        return [{"role": t.role, "content": t.content} for t in self.turns]

    @property
    def last_reply(self) -> str:
        """The answer of the last reply, its thinking left out (thinking.py; '' when there is
        none): what Copy and Save take."""
        return answer_of(next((t.content for t in reversed(self.turns) if t.role == "assistant"), ""))

    def user_indices(self) -> list[int]:
        return [i for i, t in enumerate(self.turns) if t.role == "user"]

    def first_id(self, index: int) -> int | None:
        """The store id of the first of the turns from `index` on that has one (None: none has)."""
        ids = [t.id for t in self.turns[index:] if t.id is not None]
        return min(ids) if ids else None

    def code_blocks(self) -> list[str]:
        """Every fenced code block of the conversation's messages (of the replies' answers, not
        their thinking), in order."""
        parser = MarkdownIt("gfm-like")
        out: list[str] = []
        for t in self.turns:
            text = answer_of(t.content) if t.role == "assistant" else t.content
            out += [b.content for b in parser.parse(text) if b.type == "fence" and b.content.strip()]
        return out

    # ------------------------------------------------------------------ open, new
    def reset(self, settings: ChatSettings) -> None:
        """Become a new, empty conversation with `settings` (not stored until its first reply)."""
        self.id = None
        self.turns = []
        self.settings = settings
        self.context_used = 0
        self.end_edit()

    def read(self, conversation_id: str) -> Stored:
        """A stored conversation's row and messages (AdaSparkError from the store); nothing changes."""
        return Stored(self.store.get_conversation(conversation_id), self.store.get_messages(conversation_id))

    def show(self, conversation_id: str, stored: Stored, defaults: ChatSettings) -> list[str]:
        """Become the stored conversation `stored`. Its settings are its own, a missing or unusable
        value taking `defaults`' (the returned sentences say what was unusable)."""
        self.id = conversation_id
        self.turns = [Turn(m["role"], m["content"], m["id"], m.get("meta") if isinstance(m.get("meta"), dict) else None)
                      for m in stored.messages if m["role"] in ROLES]
        self.context_used = context_used_from(stored.messages)
        self.settings, problems = ChatSettings.from_stored(stored.row, defaults)
        self.end_edit()
        return problems

    def save_settings(self, settings: ChatSettings) -> None:
        """Use `settings` from the next reply on; a stored conversation stores them first
        (AdaSparkError from the store: nothing changes)."""
        if self.id is not None:
            self.store.set_conversation_settings(self.id, settings.system, settings.to_json())
        self.settings = settings

    def markdown_rows(self) -> list[dict[str, Any]]:
        """The stored messages an export writes, the system prompt first when there is one (what
        the replies followed: part of the conversation). AdaSparkError from the store."""
        assert self.id is not None
        rows = self.store.get_messages(self.id)
        if self.settings.system:
            rows = [{"role": "system", "content": self.settings.system}, *rows]
        return rows

    # ------------------------------------------------------------------ editing
    def begin_edit(self, index: int, box_text: str) -> None:
        """Edit the user turn at `index`; `box_text` (what the message box holds) is given back by
        `end_edit`, unless an edit was already going on (then the box held that turn's text)."""
        if self.editing is None:
            self.draft = box_text
        self.editing = index

    def end_edit(self) -> str:
        """Stop editing; returns what the message box held before editing began."""
        draft, self.draft, self.editing = self.draft, "", None
        return draft

    def edit_target(self, later: bool) -> int | None:
        """The user turn to edit next: while editing, the one before (or with `later`, after) the
        edited one; otherwise the last one (`later` then: none). None when there is none."""
        users = self.user_indices()
        if self.editing is None:
            return users[-1] if users and not later else None
        if later:
            return next((i for i in users if i > self.editing), None)
        earlier = [i for i in users if i < self.editing]
        return earlier[-1] if earlier else None

    def edit_labels(self, index: int) -> tuple[str, str]:
        """The message box's title and subtitle while the user turn at `index` is edited."""
        users = self.user_indices()
        later = len(self.turns) - index - 1
        title = f"Editing message {users.index(index) + 1} of {len(users)}"
        if later:
            return title, (f"Enter resends, dropping the {counted(later, 'later message')} · "
                           "Ctrl+Up/Down other message · Esc cancels")
        return title, "Enter resends · Ctrl+Up earlier message · Esc cancels"

    # ------------------------------------------------------------------ requests
    def send_request(self, prompt: str, model_label: str) -> ReplyRequest:
        """The request for a new user message `prompt`. While a turn is edited, `prompt` replaces
        it: it and every later turn are dropped once the reply is recorded. A conversation with
        no id is created in the store first (AdaSparkError if the store refuses: nothing changes)."""
        created = False
        if self.id is None:
            self.id = self.store.create_conversation(title_from(prompt), model_label, system=self.settings.system,
                                                     settings=self.settings.to_json())
            created = True
        keep, edit_index = len(self.turns), None
        if self.editing is not None and self.editing < len(self.turns):
            keep = edit_index = self.editing
        base = self.history[:keep]
        return self._request(base, [*base, {"role": "user", "content": prompt}], prompt, created_conversation=created,
                             edit_index=edit_index, sampling=self.settings.reply_sampling())

    def regenerate_request(self) -> ReplyRequest:
        """A new reply to the last user message, with another seed (`ChatSettings.regenerate_sampling`:
        a fixed seed S goes on from the previous reply's seed + 1, else a fresh random one); the
        turns before it are kept. Refusal when there is no user message to answer again."""
        if self.id is None or not self.turns:
            raise Refusal(NOTHING_TO_REGENERATE)
        keep, previous_seed = len(self.turns), None
        if self.turns[-1].role == "assistant":
            keep -= 1
            seed = (self.turns[-1].meta or {}).get("seed")  # stored: an imported store may hold anything there
            previous_seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else None
        # else a user message with no reply (e.g. an imported conversation): answer it
        if keep == 0 or self.turns[keep - 1].role != "user":
            raise Refusal("The last reply does not follow a message of yours; nothing to regenerate.")
        base = self.history[:keep]
        return self._request(base, base, base[-1]["content"], regenerate=True,
                             sampling=self.settings.regenerate_sampling(previous_seed))

    def _request(self, base: list[dict[str, str]], turns: list[dict[str, str]], prompt: str,
                 **kwargs: Any) -> ReplyRequest:
        assert self.id is not None
        messages = self.settings.messages(turns)
        kwargs.setdefault("created_conversation", False)
        return ReplyRequest(self.id, messages, prompt, turn=sum(1 for m in messages if m["role"] == "user") - 1,
                            max_tokens=self.settings.max_tokens, base=base, replace_from=self.first_id(len(base)),
                            **kwargs)

    # ------------------------------------------------------------------ a reply ends
    def record(self, request: ReplyRequest, text: str, meta: dict[str, Any]) -> None:
        """The reply joins the turns and the store; the turns it replaces (a regenerated reply, an
        edited message and what followed it) leave both, in one store transaction. The turns
        change even when the store refuses: the AdaSparkError is raised after."""
        new: list[tuple[str, str, dict[str, Any] | None]] = []
        if not request.regenerate:
            new.append(("user", request.prompt, None))
        new.append(("assistant", text, meta))
        ids: list[int | None] = [None] * len(new)
        error: AdaSparkError | None = None
        try:
            ids = list(self.store.replace_messages_from(request.conversation_id, request.replace_from, new,
                                                        in_flight=request.in_flight))
        except AdaSparkError as err:
            error = err
        self.turns = [*self.turns[:request.keep], *(Turn(r, c, i, m) for i, (r, c, m) in zip(ids, new))]
        if error is not None:
            raise error

    # ------------------------------------------------------------------ while it streams
    def begin_in_flight(self, request: ReplyRequest, model_label: str) -> None:
        """Write the request to the store as a reply in flight, so a chat that ends before it is
        recorded (killed, a crash) loses neither its message nor its text so far: the next
        chat keeps them (`cut_replies.settle_cut_replies`). A store that refuses leaves the reply unwritten
        until it ends (`record` then says if the store still refuses)."""
        meta = cut_reply_meta(model_label, 0, None, None, request.sampling, ended=CHAT_ENDED)
        try:
            request.in_flight = self.store.begin_reply(request.conversation_id,
                                                       None if request.regenerate else request.prompt,
                                                       request.replace_from, meta, this_owner())
        except AdaSparkError:
            request.in_flight = None

    def update_in_flight(self, request: ReplyRequest, text: str, meta: dict[str, Any]) -> None:
        """The reply in flight's text so far and the meta a cut-short reply would be kept with."""
        if request.in_flight is None:
            return
        try:
            self.store.update_reply(request.in_flight, text, meta)
        except AdaSparkError:
            pass  # the next update, or the record at the end, tries again

    def end_in_flight(self, request: ReplyRequest) -> None:
        """The reply will not be recorded (withdrawn): its row among those in flight goes."""
        if request.in_flight is None:
            return
        in_flight, request.in_flight = request.in_flight, None
        try:
            self.store.end_reply(in_flight)
        except AdaSparkError:
            pass  # the next chat finds it, with this process gone, and keeps the message

    def keep_unanswered(self, request: ReplyRequest) -> None:
        """The reply ended before its first token as the app quits: its new message joins the
        turns and the store unanswered (in place of the turns it was replacing), where going back
        in the message box would lose it. A regenerate leaves the previous reply. A store that
        refuses leaves the reply in flight's row: the next chat keeps the message from it."""
        if request.regenerate:
            self.end_in_flight(request)
            return
        new: list[tuple[str, str, dict[str, Any] | None]] = [("user", request.prompt, None)]
        try:
            if request.in_flight is not None:
                ids = self.store.settle_reply(request.in_flight, new) or [None]
            else:
                ids = self.store.replace_messages_from(request.conversation_id, request.replace_from, new)
        except AdaSparkError:
            return
        self.turns = [*self.turns[:request.keep], Turn("user", request.prompt, ids[0])]

    def drop_created(self, request: ReplyRequest) -> bool:
        """A request that made this conversation gave no reply: the conversation leaves the store
        (as if the prompt had not been sent) and this one is new again. True if it was dropped."""
        if not request.created_conversation or self.turns:
            return False
        try:
            self.store.delete_conversation(request.conversation_id)
        except AdaSparkError:
            pass
        if self.id == request.conversation_id:
            self.id = None
        return True


def reply_meta(result: ReplyResult, model: str, shown_rate: float | None = None,
               shown_lag_s: float | None = None) -> dict[str, Any]:
    """What is stored with an assistant message (and shown under it).

    `tokens_per_s` is the engine's n_tokens / decode_s, measured in the engine process exactly
    as `adaspark run` measures it; `shown_tokens_per_s` is the speed the display delivered, and
    `shown_lag_ms` the longest any of its text waited to be drawn.
    """
    meta = {
        "model": model, "arm": result.arm, "n_tokens": result.n_tokens, "decode_s": round(result.decode_s, 4),
        "tokens_per_s": round(result.tokens_per_s, 2), "rounds": result.rounds,
        "widths": {str(k): v for k, v in sorted(result.widths.items())}, "stopped": result.stopped,
        "looped": result.looped,
    }
    if shown_rate is not None:
        meta["shown_tokens_per_s"] = round(shown_rate, 2)
    if shown_lag_s is not None:
        meta["shown_lag_ms"] = round(shown_lag_s * 1e3, 1)
    # What the reply was drawn with (a regenerate needs the seed to pick a new one) and how much
    # of the prompt was prefilled (the rest came from the KV cache).
    if result.sampling:
        meta["sampling"] = {k: v for k, v in result.sampling.items() if k != "seed"}
    if result.seed is not None:
        meta["seed"] = result.seed
    meta["prompt_tokens"] = result.prompt_tokens
    meta["prompt_length"] = result.prompt_length  # the whole prompt: with n_tokens, the context used
    if result.restored_tokens:  # the history came from the conversation's saved context, not a prefill
        meta["restored_tokens"] = result.restored_tokens
    if result.read_ahead_tokens:  # the history (and the message's start) read while it was typed
        meta["read_ahead_tokens"] = result.read_ahead_tokens
    if result.dropped_turns:  # the marker above the reply, shown again when the chat is reopened
        meta["dropped_turns"] = result.dropped_turns
    if result.capped_to is not None:
        meta["capped_to"] = result.capped_to
    return meta


ENGINE_DIED = "engine_died"  # a cut-short reply's meta key: the engine process ended mid-reply
CHAT_ENDED = "chat_ended"  # ... the chat ended mid-reply without recording it (a reply in flight)


def cut_reply_meta(model: str, n_tokens: int, last: RoundEvent | None, reply_rate: float | None,
                   sampling: SamplingSettings | None, ended: str = ENGINE_DIED) -> dict[str, Any]:
    """The meta of a reply cut short (`ended`: by the engine process's death, or the chat's),
    from what had arrived: its tokens, the engine time of its `last` round, and the seed it drew
    with (each round reports it; else the request's own, for a later regenerate)."""
    meta: dict[str, Any] = {"model": model, "n_tokens": n_tokens,
                            "decode_s": round(last.reply_seconds, 4) if last else 0.0,
                            "tokens_per_s": round(reply_rate or 0.0, 2), "stopped": True, ended: True}
    seed = last.seed if last is not None and last.seed is not None else None
    if seed is None and sampling is not None and not sampling.greedy:
        seed = sampling.seed
    if seed is not None:
        meta["seed"] = seed
    return meta


def context_marks(meta: dict[str, Any] | None) -> tuple[int, int | None] | None:
    """What the marker above a stored reply says (turns left out of its prompt, the cap the
    context set on it), from its meta; None when it has no marker."""
    if not meta or not (meta.get("dropped_turns") or meta.get("capped_to")):
        return None
    dropped, capped = meta.get("dropped_turns"), meta.get("capped_to")
    return dropped if isinstance(dropped, int) else 0, capped if isinstance(capped, int) else None


def reply_note(meta: Any, sep: str = " · ") -> str:
    """'42 tokens · 95.3 tok/s · 20 rounds · stopped' from a reply's stored meta (a value of
    another type, in a store from elsewhere, is left out)."""
    if not isinstance(meta, dict):
        return ""
    parts = []
    if isinstance(meta.get("n_tokens"), int):
        parts.append(counted(meta["n_tokens"], "token"))
    rate = meta.get("tokens_per_s")
    if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate:
        parts.append(f"{rate:.1f} tok/s")
    if isinstance(meta.get("rounds"), int) and meta["rounds"]:
        parts.append(counted(meta["rounds"], "round"))
    for key, said in (("restored_tokens", "history tokens from disk"),
                      ("read_ahead_tokens", "tokens read ahead")):
        n = meta.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            parts.append(f"{n:,} {said}")
    if meta.get(ENGINE_DIED):
        parts.append("stopped: the engine process ended")
    elif meta.get(CHAT_ENDED):
        parts.append("stopped: the chat ended")
    elif meta.get("stopped"):
        parts.append("stopped")
    elif meta.get("looped"):
        parts.append("token cap reached")
    return sep.join(parts)


def context_used_from(rows: list[dict[str, Any]]) -> int | None:
    """The context tokens a stored conversation's last reply took (its prompt and its text), from
    that reply's meta; 0 with no reply, None when the meta does not tell (stored before)."""
    for m in reversed(rows):
        if m.get("role") != "assistant":
            continue
        meta = m.get("meta") if isinstance(m.get("meta"), dict) else {}
        length, n = meta.get("prompt_length"), meta.get("n_tokens")
        if isinstance(length, int) and isinstance(n, int):
            return length + n
        return None
    return 0
