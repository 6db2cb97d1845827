"""The chat's `Conversation` model alone (ui/conversation.py): no Textual, a real SQLite store file.

What it guards: the requests a reply is asked with (which turns are kept, which stored message is
the first replaced, the seed of a regenerated reply), what a recorded reply does to the turns and
the store, the edit state, and the reading of a stored conversation.
"""

from __future__ import annotations

import pytest

from adaspark_app.engine.events import RoundEvent
from adaspark_app.engine.sampling import SamplingSettings
from adaspark_app.errors import StoreError
from adaspark_app.store import Store
from adaspark_app.ui.chat_settings import ChatSettings
from adaspark_app.ui.conversation import (Conversation, Refusal, context_marks, context_used_from,
                                          cut_reply_meta, reply_note)

SYSTEM = ChatSettings(system="Be brief.", max_tokens=40, sampling=SamplingSettings(temperature=0.7, seed=11))
FREE = ChatSettings(sampling=SamplingSettings(temperature=0.7))


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "chats.db")
    yield s
    s.close()


def stored_chat(store, turns: list[tuple[str, str, dict | None]], settings: ChatSettings = FREE) -> Conversation:
    """A Conversation opened on a stored conversation with `turns` ((role, text, meta) each)."""
    cid = store.create_conversation("t", "m", system=settings.system, settings=settings.to_json())
    for role, text, meta in turns:
        store.add_message(cid, role, text, meta=meta)
    conv = Conversation(store, ChatSettings())
    conv.show(cid, conv.read(cid), ChatSettings())
    return conv


def reply(conv: Conversation, request, text: str, meta: dict | None = None) -> None:
    conv.record(request, text, meta or {"n_tokens": 1})


# ---------------------------------------------------------------------------- sending
def test_first_message_creates_the_stored_conversation_with_its_settings(store):
    conv = Conversation(store, SYSTEM)
    request = conv.send_request("  What is a monad?", "SmolLM2")
    assert request.created_conversation and conv.id == request.conversation_id
    row = store.get_conversation(conv.id)
    assert row["title"] == "What is a monad?" and row["model"] == "SmolLM2"
    assert row["system"] == "Be brief." and row["settings"]["max_tokens"] == 40
    # the engine gets the system prompt first, then the new message; it is the first user turn
    assert request.messages == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "  What is a monad?"}]
    assert (request.turn, request.max_tokens, request.sampling) == (0, 40, SYSTEM.sampling)
    assert request.keep == 0 and request.replace_from is None and store.get_messages(conv.id) == []


def test_a_later_message_keeps_every_turn_and_replaces_nothing(store):
    conv = stored_chat(store, [("user", "q1", None), ("assistant", "a1", {"n_tokens": 2})])
    request = conv.send_request("q2", "m")
    assert not request.created_conversation and request.keep == 2 and request.replace_from is None
    assert request.turn == 1 and request.messages[-1] == {"role": "user", "content": "q2"}
    reply(conv, request, "a2")
    assert [m["content"] for m in store.get_messages(conv.id)] == ["q1", "a1", "q2", "a2"]
    assert [t.id for t in conv.turns] == [m["id"] for m in store.get_messages(conv.id)]


def test_an_edited_message_replaces_it_and_every_later_turn_once_recorded(store):
    conv = stored_chat(store, [("user", "q1", None), ("assistant", "a1", None),
                               ("user", "q2", None), ("assistant", "a2", None)])
    ids = [t.id for t in conv.turns]
    conv.begin_edit(0, "")
    request = conv.send_request("q1 edited", "m")
    assert request.edit_index == 0 and request.keep == 0 and request.replace_from == ids[0]
    assert request.messages == [{"role": "user", "content": "q1 edited"}]
    assert len(store.get_messages(conv.id)) == 4  # nothing is dropped before the reply is recorded
    reply(conv, request, "a1 again")
    assert [m["content"] for m in store.get_messages(conv.id)] == ["q1 edited", "a1 again"]
    assert conv.history == [{"role": "user", "content": "q1 edited"}, {"role": "assistant", "content": "a1 again"}]


def test_a_store_that_refuses_the_first_message_leaves_the_conversation_new(store):
    conv = Conversation(store, FREE)
    store.close()
    with pytest.raises(StoreError):
        conv.send_request("hello", "m")
    assert conv.id is None and conv.turns == []


def test_a_reply_the_store_refuses_still_joins_the_turns(store):
    conv = stored_chat(store, [("user", "q1", None), ("assistant", "a1", None)])
    request = conv.send_request("q2", "m")
    store.delete_conversation(conv.id)  # gone under it: the write fails
    with pytest.raises(StoreError):
        reply(conv, request, "a2")
    assert conv.history[-2:] == [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]
    assert [t.id for t in conv.turns[-2:]] == [None, None]


def test_a_conversation_made_for_a_withdrawn_message_leaves_the_store(store):
    conv = Conversation(store, FREE)
    request = conv.send_request("hello", "m")
    assert conv.drop_created(request)
    assert conv.id is None and store.list_conversations() == []
    # one that had turns before the message stays
    kept = stored_chat(store, [("user", "q1", None), ("assistant", "a1", None)])
    assert not kept.drop_created(kept.send_request("q2", "m")) and kept.id is not None


# ---------------------------------------------------------------------------- regenerate
def test_regenerate_keeps_the_turns_before_the_last_reply_and_replaces_it(store):
    conv = stored_chat(store, [("user", "q1", None), ("assistant", "a1", None),
                               ("user", "q2", None), ("assistant", "a2", {"seed": 5})])
    request = conv.regenerate_request()
    assert request.regenerate and request.keep == 3 and request.replace_from == conv.turns[3].id
    assert request.prompt == "q2" and request.messages == conv.history[:3] and request.turn == 1
    reply(conv, request, "a2 again", {"seed": 6})
    assert [m["content"] for m in store.get_messages(conv.id)] == ["q1", "a1", "q2", "a2 again"]


def test_regenerate_with_a_fixed_seed_goes_on_from_the_previous_replys_seed(store):
    fixed = ChatSettings(sampling=SamplingSettings(temperature=0.7, seed=100))
    conv = stored_chat(store, [("user", "q", None), ("assistant", "a", {"seed": 104})], fixed)
    assert conv.regenerate_request().sampling.seed == 105
    # a previous seed the store mangled (a bool, text) counts as none: the fixed seed + 1
    conv = stored_chat(store, [("user", "q", None), ("assistant", "a", {"seed": True})], fixed)
    assert conv.regenerate_request().sampling.seed == 101


def test_regenerate_without_a_fixed_seed_draws_another_than_the_previous_one(store):
    conv = stored_chat(store, [("user", "q", None), ("assistant", "a", {"seed": 7})])
    seeds = {conv.regenerate_request().sampling.seed for _ in range(4)}
    assert None not in seeds and 7 not in seeds and len(seeds) == 4


def test_regenerate_answers_a_last_user_message_that_has_no_reply(store):
    conv = stored_chat(store, [("user", "q1", None), ("assistant", "a1", None), ("user", "q2", None)])
    request = conv.regenerate_request()
    assert request.keep == 3 and request.replace_from is None and request.prompt == "q2"


@pytest.mark.parametrize("turns, why", [
    ([], "No reply to regenerate yet."),
    ([("assistant", "hello first", None)], "does not follow a message of yours"),
    ([("user", "q", None), ("assistant", "a", None), ("assistant", "b", None)], "does not follow"),
])
def test_regenerate_is_refused_without_a_user_message_to_answer(store, turns, why):
    conv = stored_chat(store, turns) if turns else Conversation(store, FREE)
    with pytest.raises(Refusal, match=why):
        conv.regenerate_request()


# ---------------------------------------------------------------------------- editing
def test_moving_between_edited_messages_keeps_the_first_draft(store):
    conv = stored_chat(store, [("user", "q1", None), ("assistant", "a1", None),
                               ("user", "q2", None), ("assistant", "a2", None)])
    assert conv.edit_target(later=True) is None  # not editing: nothing after
    first = conv.edit_target(later=False)
    assert first == 2
    conv.begin_edit(first, "my draft")
    assert conv.edit_target(later=False) == 0 and conv.edit_target(later=True) is None
    conv.begin_edit(0, "q2")  # the box held the edited message's text: not a draft
    assert conv.edit_target(later=True) == 2 and conv.edit_target(later=False) is None
    assert conv.end_edit() == "my draft" and conv.editing is None and conv.draft == ""


def test_edit_labels_count_the_later_messages_dropped(store):
    conv = stored_chat(store, [("user", "q1", None), ("assistant", "a1", None),
                               ("user", "q2", None), ("assistant", "a2", None)])
    title, subtitle = conv.edit_labels(0)
    assert title == "Editing message 1 of 2" and "dropping the 3 later messages" in subtitle
    assert "dropping the 1 later message ·" in conv.edit_labels(2)[1]
    conv.turns = conv.turns[:3]
    assert conv.edit_labels(2) == ("Editing message 2 of 2", "Enter resends · Ctrl+Up earlier message · Esc cancels")


# ---------------------------------------------------------------------------- a stored conversation
def test_a_stored_conversation_opens_with_its_own_settings_and_context(store):
    meta = {"n_tokens": 12, "prompt_length": 30, "seed": 3, "dropped_turns": 2}
    cid = store.create_conversation("t", "m", system="Terse.", settings=ChatSettings(max_tokens=9).to_json())
    store.add_message(cid, "user", "q")
    store.add_message(cid, "tool", "a tool's output")  # stored, but not a turn the chat shows
    store.add_message(cid, "assistant", "a", meta=meta)
    conv = Conversation(store, ChatSettings())
    conv.begin_edit(0, "draft")
    assert conv.show(cid, conv.read(cid), ChatSettings(max_tokens=77)) == []
    assert [t.role for t in conv.turns] == ["user", "assistant"] and conv.turns[1].meta == meta
    assert conv.settings.system == "Terse." and conv.settings.max_tokens == 9
    assert conv.context_used == 42 and conv.last_reply == "a" and conv.editing is None


def test_unusable_stored_settings_fall_back_to_the_defaults_with_a_reason(store):
    cid = store.create_conversation("t", "m", settings={"max_tokens": 0})
    conv = Conversation(store, ChatSettings())
    problems = conv.show(cid, conv.read(cid), ChatSettings(max_tokens=77))
    assert conv.settings.max_tokens == 77 and any("--max-tokens" in p for p in problems)


def test_reading_a_conversation_the_store_cannot_give_changes_nothing(store):
    conv = stored_chat(store, [("user", "q", None)])
    before = (conv.id, conv.history)
    store.close()
    with pytest.raises(StoreError):
        conv.read("elsewhere")
    assert (conv.id, conv.history) == before


def test_new_settings_are_stored_first_and_kept_only_if_stored(store):
    conv = stored_chat(store, [("user", "q", None)])
    conv.save_settings(SYSTEM)
    assert store.get_conversation(conv.id)["system"] == "Be brief." and conv.settings == SYSTEM
    store.delete_conversation(conv.id)
    with pytest.raises(StoreError):
        conv.save_settings(FREE)
    assert conv.settings == SYSTEM


def test_an_export_starts_with_the_system_prompt_the_replies_followed(store):
    conv = stored_chat(store, [("user", "q", None), ("assistant", "a", None)], SYSTEM)
    assert [(r["role"], r["content"]) for r in conv.markdown_rows()] == [
        ("system", "Be brief."), ("user", "q"), ("assistant", "a")]


def test_reset_forgets_the_conversation_and_its_edit(store):
    conv = stored_chat(store, [("user", "q", None), ("assistant", "a", {"prompt_length": 1, "n_tokens": 1})])
    conv.begin_edit(0, "draft")
    conv.reset(SYSTEM)
    assert (conv.id, conv.turns, conv.settings, conv.context_used, conv.editing) == (None, [], SYSTEM, 0, None)
    assert conv.last_reply == ""


def test_code_blocks_of_every_turn_in_order(store):
    conv = stored_chat(store, [("user", "```\nmine\n```", None),
                               ("assistant", "a\n\n```python\nx = 1\n```\n\n```\n\n```", None)])
    assert conv.code_blocks() == ["mine\n", "x = 1\n"]  # a blank block is no code


# ---------------------------------------------------------------------------- metas
def round_event(seed: int | None, reply_seconds: float = 0.5) -> RoundEvent:
    return RoundEvent(conversation="c", turn=0, round_index=3, context=40, width=4, measured=False,
                      verify_ms_predicted=10.0, verify_ms=10.0, fixed_ms=1.0, expected_accepted=1.0, accepted=1,
                      committed=2, priced_by="fitted", rows_by_source={}, accepted_by_source={}, offered={},
                      band_rate=None, text="x", reply_tokens=9, reply_seconds=reply_seconds, seed=seed)


def test_a_reply_cut_by_the_engines_death_keeps_the_seed_it_drew_with():
    meta = cut_reply_meta("m", 9, round_event(seed=77), 18.0, SamplingSettings(temperature=0.5, seed=5))
    assert meta["seed"] == 77 and meta["engine_died"] and meta["stopped"] and meta["decode_s"] == 0.5
    # no round told it: the request's own seed, unless it drew greedily
    assert cut_reply_meta("m", 0, None, None, SamplingSettings(temperature=0.5, seed=5))["seed"] == 5
    assert "seed" not in cut_reply_meta("m", 0, round_event(seed=None), None, SamplingSettings())


def test_the_note_and_marker_of_a_stored_reply():
    assert reply_note({"n_tokens": 42, "tokens_per_s": 95.33, "rounds": 20, "stopped": True}) == \
        "42 tokens · 95.3 tok/s · 20 rounds · stopped"
    assert reply_note({"n_tokens": 3, "engine_died": True, "stopped": True}).endswith("the engine process ended")
    assert reply_note({"n_tokens": 1, "tokens_per_s": 12.0, "rounds": 1}) == "1 token · 12.0 tok/s · 1 round"
    # a store from elsewhere: values of another type are left out, never a crash of the chat
    assert reply_note({"n_tokens": "many", "tokens_per_s": "fast", "rounds": [3], "stopped": True}) == "stopped"
    assert context_marks({"dropped_turns": 2}) == (2, None)
    assert context_marks({"capped_to": 30, "dropped_turns": "x"}) == (0, 30)
    assert context_marks({"n_tokens": 4}) is None and context_marks(None) is None


def test_context_used_is_unknown_for_a_reply_stored_without_its_prompt_length():
    assert context_used_from([{"role": "user"}]) == 0
    assert context_used_from([{"role": "assistant", "meta": {"n_tokens": 5}}, {"role": "user"}]) is None
    assert context_used_from([{"role": "assistant", "meta": {"n_tokens": 5, "prompt_length": 20}}]) == 25
