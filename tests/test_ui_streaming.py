"""The cheap streaming render (issue 17): where a growing reply is cut into settled Markdown and
a plain-text tail, and what the chat shows while and after a reply streams.

The cut is checked against markdown-it itself: for every prefix of a reply, the blocks of the
whole reply must be the blocks of the settled part followed by the blocks of the rest, so what
is rendered early never changes later. The app tests run the real Textual app with the scripted
engine in its own process (tests/ui_fakes.py).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from textual.app import App, ComposeResult

from adaspark_app.store import Store
from adaspark_app.ui.app import AdaSparkApp
from adaspark_app.ui.settled import is_list_item, settled_length
from adaspark_app.ui.widgets import ChatMessage, ChatView
from benchmarks.common import RESULTS, read_jsonl
from ui_fakes import notifications, notified, scripted, spawn_event, wait_until

FENCE = "`" * 3
SIZE = (100, 30)
STREAM = RESULTS / "tui-vs-headless" / "ui-cpu-stream.jsonl.gz"

TRICKY = [
    # code fences: blank lines inside, tildes, a longer closing fence, a fence in a fence
    f"Here:\n\n{FENCE}python\ndef f(x):\n\n    return x\n{FENCE}\n\nDone.\n",
    "A\n\n~~~\n```\nnot a close\n```\n\n~~~\n\nB\n",
    f"x\n\n{FENCE}\ncode\n{FENCE}{FENCE}\n\nafter\n\n{FENCE}{FENCE}\nlong\n{FENCE}\nstill\n{FENCE}{FENCE}\n\nend\n",
    f"Unclosed:\n\n{FENCE}js\nlet a = 1;\n\nlet b = 2;\n",
    # lists: tight, loose, with continuations, ordered starting elsewhere, then paragraphs
    "Steps:\n\n1. one\n2. two\n\n3. three\n\n   more of three\n\nAfter the list.\n\n- a\n- b\n",
    "- a\n\n  continued\n\n- b\n\n    indented code in b\n\nText\n",
    "* x\n\n+ y\n\n10) ten\n\n11) eleven\n\nfin\n",
    # headings, quotes, tables, rules, setext, indented code after a paragraph
    "# Title\n\nPara\n\n> quote\n> more\n\n> another\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n---\n\nSetext\n===\n\n    code\n\nend\n",
    "Line one\nline two\n\n\n\nAfter blanks\n   \nSpace-only line above\n\nlast",
]


def blocks(text: str) -> list[tuple]:
    """markdown-it's tokens of `text`, without their line numbers."""
    md = MarkdownIt("gfm-like")
    return [(t.type, t.tag, t.nesting, t.level, t.content, t.markup, t.info, t.hidden,
             tuple(sorted((t.attrs or {}).items())), tuple((c.type, c.content) for c in t.children or ()))
            for t in md.parse(text)]


def replies() -> list[str]:
    """The recorded model replies (prose, lists and code) and the tricky texts."""
    recorded = [row["result"]["text"] for row in read_jsonl(STREAM)]
    return recorded + TRICKY


# ---------------------------------------------------------------------------- the cut
@pytest.mark.parametrize("text", replies(), ids=lambda t: t[:24].replace("\n", "|"))
def test_a_cut_never_changes_the_blocks_before_it(text):
    cuts = set()
    for end in range(len(text) + 1):
        cut = settled_length(text[:end])
        assert 0 <= cut <= end
        cuts.add(cut)
    for cut in cuts - {0}:
        assert blocks(text) == blocks(text[:cut]) + blocks(text[cut:]), f"cut at {cut}: {text[:cut]!r} | {text[cut:]!r}"


def test_cuts_follow_blank_lines_outside_fences():
    assert settled_length("Para one.\n\nPara two") == len("Para one.\n\n")
    assert settled_length("Para one.\n\n") == 0  # what comes next (an indented line?) is unknown
    assert settled_length("Just one paragraph, still going") == 0
    # inside an open fence nothing settles, blank lines or not
    assert settled_length(f"a\n\n{FENCE}py\nx = 1\n\ny = 2\n") == len("a\n\n")
    closed = f"a\n\n{FENCE}py\nx = 1\n\ny = 2\n{FENCE}\n\nb"
    assert settled_length(closed) == closed.index("b")
    # a fence closes only with its own character, at least as long
    assert settled_length(f"~~~\n{FENCE}\n\nz") == 0
    assert settled_length(f"{FENCE}{FENCE}\n{FENCE}\n\nz") == 0


def test_lists_are_not_split_where_they_could_go_on():
    assert settled_length("- a\n\n- b") == 0  # a loose list: "- b" may join it
    assert settled_length("- a\n\n  more\n\n- b\n\nText") == len("- a\n\n  more\n\n- b\n\n")
    assert settled_length("- a\n- b\n\nText") == len("- a\n- b\n\n")
    assert settled_length("Intro\n\n1. one\n") == len("Intro\n\n")  # a list after a paragraph starts anew


def test_a_partial_line_is_waited_for_when_its_start_is_ambiguous():
    assert settled_length("a\n\n1") == 0  # "1" may become "1. item"
    assert settled_length("a\n\n-") == 0
    assert settled_length("a\n\n``") == 0
    assert settled_length("a\n\nHel") == len("a\n\n")  # a letter starts a paragraph
    assert settled_length("a\n\n  ") == 0


def test_list_items():
    assert is_list_item("- x") and is_list_item("* x") and is_list_item("12) x") and is_list_item("3. x")
    assert not is_list_item("-x") and not is_list_item("3.x") and not is_list_item("**bold**")


# ---------------------------------------------------------------------------- the widget
def signature(markdown) -> list[tuple[str, str]]:
    """What a Markdown widget shows: each block's kind and text, in order."""
    out = []
    for w in markdown.walk_children():
        content = getattr(w, "_content", None)
        code = getattr(w, "code", None)
        out.append((type(w).__name__, code if isinstance(code, str) else (content.plain if content is not None else "")))
    return out


class ViewHost(App):
    def compose(self) -> ComposeResult:
        yield ChatView()



async def streamed_reply(pilot, fragments: list[str]) -> ChatMessage:
    """A reply written into a ViewHost's view fragment by fragment, then finished."""
    msg = await pilot.app.query_one(ChatView).add_message("assistant", "")
    await pilot.pause()
    for fragment in fragments:
        await msg.write(fragment)
    await msg.finish("done")
    return msg

THOUGHT = "<think>\nFirst I list them.\n\nThen I check the list.\n</think>\n\nRed, green and blue."


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13])
async def test_a_thinking_reply_cut_into_any_fragments_ends_as_the_whole_text_shows(size):
    """The reply's tags may come cut anywhere between fragments ('<th' then 'ink>', '</t' then
    'hink>'): the streamed message ends with the same thinking, answer and fold as the stored
    reply shows when opened."""
    async with ViewHost().run_test(size=(100, 40)) as pilot:
        streamed = await streamed_reply(pilot, [THOUGHT[i:i + size] for i in range(0, len(THOUGHT), size)])
        stored = await pilot.app.query_one(ChatView).add_message("assistant", THOUGHT)
        await pilot.pause()
        for msg in (streamed, stored):
            block = msg.thinking_block
            assert block is not None and block.collapsed and block.title == "Thought (9 words)"
            assert block.text == "First I list them.\n\nThen I check the list."
            assert msg.body.source.strip() == "Red, green and blue." and not msg.still_thinking
        assert streamed.text == THOUGHT


async def test_a_thinking_reply_whose_answer_is_empty_leaves_its_thinking_open():
    """A model that closes its thinking and ends there (seen with Qwen2.5-Coder-0.5B told to think in
    tags): folded, the reply would show nothing but its title."""
    text = "<think>\n17 times 3 equals 51.\n</think>\n"
    async with ViewHost().run_test(size=(100, 40)) as pilot:
        streamed = await streamed_reply(pilot, [text[:12], text[12:]])
        stored = await pilot.app.query_one(ChatView).add_message("assistant", text)
        await pilot.pause()
        for msg in (streamed, stored):
            assert not msg.thinking_block.collapsed and msg.thinking_block.title == "Thought (5 words)"


@pytest.mark.parametrize("text", ["<", "<thin", "  \n", "<div>not thinking</div>", "<thinking>other tag</thinking>"])
async def test_a_reply_that_only_starts_like_the_tag_is_shown_whole(text):
    async with ViewHost().run_test(size=(100, 40)) as pilot:
        msg = await streamed_reply(pilot, list(text))
        assert msg.thinking_block is None and msg.body.source == text


@pytest.mark.parametrize("text", TRICKY[:4] + [replies()[0]], ids=lambda t: t[:24].replace("\n", "|"))
async def test_streamed_reply_ends_rendered_as_the_whole_text(text):
    app = ViewHost()
    async with app.run_test(size=(100, 40)) as pilot:
        view = app.query_one(ChatView)
        streamed = await view.add_message("assistant", "")
        await pilot.pause()
        for i in range(0, len(text), 7):  # fragments that split lines, fences and list markers
            await streamed.write(text[i:i + 7])
            if i % 70 == 0:
                await pilot.pause()
        await streamed.finish("done")
        whole = await view.add_message("assistant", text)
        await pilot.pause(0.2)
        assert streamed.text == text and streamed.tail == ""
        assert not streamed.tail_widget.display and streamed.tail_widget.styles.min_height is None
        assert streamed.body.source == text
        assert signature(streamed.body) == signature(whole.body)


async def test_settled_blocks_render_as_markdown_and_the_rest_waits_as_plain_text():
    app = ViewHost()
    async with app.run_test(size=(100, 40)) as pilot:
        view = app.query_one(ChatView)
        msg = await view.add_message("assistant", "")
        await pilot.pause()
        await msg.write("First **bold** paragraph.\n\n")
        await pilot.pause()
        await msg.write("Second paragraph, still being wri")
        await pilot.pause()
        # The first write laid out the tail: nothing was settled yet, so all is plain text.
        assert msg.body.source == ""
        assert "**bold**" in msg.tail_widget.text and any("**bold**" in r for r in msg.tail_widget.rows)
        # Within the tail's room, later fragments repaint the tail only (the Markdown stays).
        assert msg._reserved >= 6
        await msg.write("tten")
        assert msg.body.source == "" and msg.tail.endswith("wri" + "tten")
        # Past the room (a page of the view), while the view follows the end: the tail turns a
        # page within itself; nothing moves to the Markdown and the message keeps its height.
        height = msg.outer_size.height
        await msg.write(" and more.\n" * 60)
        await pilot.pause()
        assert msg.body.source == "" and msg.outer_size.height == height
        tail = msg.tail_widget
        shown = [tail.render_line(y).text.rstrip() for y in range(tail.size.height)]
        assert tail.window == msg._reserved and shown[-1] == tail.rows[-1].rstrip()
        assert shown[0] != tail.rows[0]  # the first rows are above the page now
        # The reader scrolls up: the next text moves the settled paragraph to the Markdown, the
        # rest stays plain, every row shown.
        view.following = False
        await msg.write(" still more.\n")
        await pilot.pause()
        assert msg.body.source == "First **bold** paragraph.\n\n"
        assert msg.tail.startswith("Second paragraph") and msg.tail_widget.window is None
        await msg.finish()
        assert msg.body.source == msg.text


@contextlib.asynccontextmanager
async def reply_with_room(size: tuple[int, int] = (100, 40)):
    """A chat view at `size` holding an empty reply that has made its room, laid out."""
    app = ViewHost()
    async with app.run_test(size=size) as pilot:
        view = app.query_one(ChatView)
        msg = await view.add_message("assistant", "")
        msg.make_room()
        await pilot.pause()
        yield pilot, view, msg


async def test_a_paging_tail_follows_a_smaller_terminal_so_its_new_rows_stay_in_sight():
    async with reply_with_room() as (pilot, view, msg):
        await msg.write("".join(f"line {i}\n" for i in range(80)))
        await pilot.pause()
        tail = msg.tail_widget
        assert tail.window is not None and tail.window > 20
        await pilot.resize_terminal(100, 20)
        await pilot.pause()
        await msg.write("one more line\n")
        await pilot.pause()
        assert tail.window == msg._reserved <= view.size.height - ChatMessage.KEEP_LINES
        assert tail.outer_size.height <= view.size.height  # the page, and so its new rows, fit the view
        await msg.finish()
        assert msg.body.source == msg.text


async def test_finish_hides_the_tail_and_its_room_even_when_nothing_is_left_in_it():
    async with reply_with_room() as (pilot, view, msg):
        assert msg.tail_widget.display and msg.tail_widget.outer_size.height >= ChatMessage.HEADROOM_MIN
        await msg.finish("n")
        await pilot.pause()
        assert not msg.tail_widget.display and msg.tail_widget.styles.min_height is None


# ---------------------------------------------------------------------------- the app
async def test_while_a_reply_streams_the_cursor_does_not_blink_and_the_text_is_exact(tmp_path):
    held, gate = spawn_event(), spawn_event()
    reply = f"Intro line.\n\n{FENCE}python\nprint(1)\n\nprint(2)\n{FENCE}\n\n- a\n- b\n\nEnd."
    store = Store.open(tmp_path / "s.db")
    app = AdaSparkApp(scripted([reply], hold_after_rounds=3, held=held, gate=gate), store, store_label="s.db",
                      exit_on_load_error=False)
    try:
        async with app.run_test(size=SIZE) as pilot:
            chat = app.chat_screen
            await wait_until(pilot, lambda: app.engine.ready)
            assert chat.prompt.cursor_blink
            chat.prompt.focus()
            chat.prompt.text = "go"
            await pilot.press("enter")
            await wait_until(pilot, held.is_set)
            await wait_until(pilot, lambda: chat.chat_view.messages()[-1].text)
            assert chat.generating and not chat.prompt.cursor_blink
            gate.set()
            await wait_until(pilot, lambda: not chat.generating)
            assert chat.prompt.cursor_blink
            reply_msg = chat.chat_view.messages()[-1]
            assert reply_msg.text == reply and reply_msg.body.source == reply and reply_msg.tail == ""
    finally:
        store.close()


@contextlib.asynccontextmanager
async def ready_chat(tmp_path: Path, replies: list[str], app_options: dict | None = None, **engine_options):
    """The real app on a fresh store with the scripted engine (`engine_options` to `scripted`,
    `app_options` to the app), loaded."""
    store = Store.open(tmp_path / "s.db")
    app = AdaSparkApp(scripted(replies, **engine_options), store, store_label="s.db", exit_on_load_error=False,
                      **(app_options or {}))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.engine.ready)
            yield app, pilot, store
    finally:
        store.close()


def probe_at_generate(app, probe):
    """What `probe()` reads at each moment the engine is asked for a reply (a list, filled as
    requests go out; the real request still goes to the engine)."""
    seen: list = []
    generate = app.engine.generate

    def spy(*args, **kwargs):
        seen.append(probe())
        return generate(*args, **kwargs)

    app.engine.generate = spy  # type: ignore[method-assign]
    return seen


async def test_the_engine_is_asked_only_after_the_new_messages_are_painted(tmp_path):
    # The first layout and paint of a send (30-50 ms) must not run beside the reply's first rounds.
    async with ready_chat(tmp_path, ["Fine."]) as (app, pilot, store):
        chat = app.chat_screen

        def reply_laid_out() -> bool:
            reply_msg = chat.chat_view.messages()[-1]
            return bool(reply_msg.tail_widget.size.height) and bool(reply_msg.region.height)

        painted = probe_at_generate(app, reply_laid_out)
        assert await chat.send("hello")
        assert painted == [] and app.engine.pending is None  # not yet: nothing laid out
        await wait_until(pilot, lambda: not chat.generating)
        assert painted == [True]
        assert chat.chat_view.messages()[-1].text == "Fine."


async def test_the_engine_is_asked_only_after_the_view_scrolled_to_the_new_messages(tmp_path):
    # The scroll to the end that follows the new messages' layout repaints the whole view
    # (30-60 ms): the request must wait for it too, or that paint runs beside the first rounds.
    from adaspark_app.ui.screens.replies import screen_settled

    async with ready_chat(tmp_path, ["Fine.", "Also fine."]) as (app, pilot, store):
        chat = app.chat_screen
        view = chat.chat_view
        assert await chat.send("hello")
        await wait_until(pilot, lambda: not chat.generating)
        seen = probe_at_generate(app, lambda: (screen_settled(chat), view.max_scroll_y > 0,
                                               view.scroll_y == view.max_scroll_y))
        assert await chat.send("\n".join(f"line {i} of a long paste" for i in range(80)))
        await wait_until(pilot, lambda: not chat.generating)
        assert seen == [(True, True, True)]


async def test_objects_alive_at_a_send_are_left_out_of_collections_until_the_reply_ends(tmp_path):
    import gc

    async with ready_chat(tmp_path, ["Fine."]) as (app, pilot, store):
        chat = app.chat_screen
        frozen = probe_at_generate(app, gc.get_freeze_count)
        gc.unfreeze()
        assert await chat.send("hello")
        await wait_until(pilot, lambda: not chat.generating)
        assert frozen and frozen[0] > 1000  # the UI's objects, frozen before the engine is asked
        await wait_until(pilot, lambda: gc.get_freeze_count() == 0, what="the thaw after the reply")


async def test_esc_before_the_request_is_sent_gives_the_prompt_back(tmp_path):
    async with ready_chat(tmp_path, ["never"]) as (app, pilot, store):
        chat = app.chat_screen
        asked: list[tuple] = []
        app.engine.generate = lambda *a, **k: asked.append(a) or 1  # type: ignore[method-assign]
        assert await chat.send("stop me")
        assert chat.stop_reply()
        await wait_until(pilot, lambda: not chat.generating)
        assert asked == [] and chat.prompt.text == "stop me"
        assert not chat.chat_view.messages() and store.list_conversations() == []


# ---------------------------------------------------------------------------- a reasoning model's thinking
THINKING = "The user wants three colours.\n\nPrimary ones are the safest answer."
ANSWER = f"Red, **green** and blue:\n\n{FENCE}python\ncolours = ['red', 'green', 'blue']\n{FENCE}"


async def test_a_reply_that_thinks_streams_its_thinking_dimmed_and_folds_it_above_the_answer(tmp_path):
    """A reply in <think>...</think> first: while it thinks, an open 'Thinking…' block above a
    dimmed tail with no tag shown; at </think> the block folds to its length and the answer
    streams as Markdown below it. Copy and code-block copy take the answer, the store keeps the
    whole text, the export folds the thinking, and the reopened conversation shows it folded."""
    from adaspark_app.ui.widgets.chat_view import ThinkingBlock

    reply = f"<think>\n{THINKING}\n</think>\n\n{ANSWER}"
    held, gate = spawn_event(), spawn_event()
    async with ready_chat(tmp_path, [reply], {"export_dir": tmp_path}, hold_after_rounds=3, held=held,
                          gate=gate) as (app, pilot, store):
        chat = app.chat_screen
        chat.prompt.text = "Name three colours"
        await pilot.press("enter")
        await wait_until(pilot, held.is_set)
        msg = chat.chat_view.messages()[-1]
        await wait_until(pilot, lambda: "user" in msg.tail_widget.text, what="the thinking in the tail")
        block = msg.thinking_block
        assert block is not None and not block.collapsed and block.title == "Thinking…"
        assert msg.tail_widget.has_class("thinking") and "<think>" not in msg.tail_widget.text
        gate.set()
        await wait_until(pilot, lambda: not chat.generating)
        assert block.collapsed and block.title == "Thought (11 words)" and block.text == THINKING
        assert not msg.tail_widget.has_class("thinking") and not msg.still_thinking
        assert msg.body.source.strip() == ANSWER and msg.text == reply
        assert len(msg.query(ThinkingBlock)) == 1
        await pilot.press("ctrl+o")
        assert app.clipboard == ANSWER
        await pilot.press("f9")
        assert app.clipboard == "colours = ['red', 'green', 'blue']"
        cid = chat.conversation.id
        assert store.get_messages(cid)[-1]["content"] == reply
        exported = chat.export_markdown().read_text()
        assert "<details>\n<summary>Thought (11 words)</summary>\n\n" + THINKING in exported
        assert exported.rstrip().endswith(ANSWER) and "<think>" not in exported
        await chat.new_conversation()
        await chat.open_conversation(cid)
        await pilot.pause()
        shown = chat.chat_view.messages()[-1]
        assert shown.thinking_block is not None and shown.thinking_block.collapsed
        assert shown.thinking_block.text == THINKING and shown.body.source.strip() == ANSWER


async def test_a_reply_whose_prompt_opened_the_thinking_is_thinking_from_its_first_token(tmp_path):
    """A model whose template ends its prompt with <think> (the engine says so when it loads):
    the reply's first text is thinking, though it never writes the opening tag. A reply stopped
    inside its thinking keeps it open, titled so."""
    reply = "Okay, so three colours.\n\nRed, green, blue it is.\n</think>\n\nRed, green and blue."
    held = spawn_event()
    async with ready_chat(tmp_path, [reply], hold_after_rounds=3, held=held, opens_thinking=True) as (app, pilot, _):
        chat = app.chat_screen
        assert app.opens_thinking
        chat.prompt.text = "Name three colours"
        await pilot.press("enter")
        await wait_until(pilot, held.is_set)
        msg = chat.chat_view.messages()[-1]
        await wait_until(pilot, lambda: "three" in msg.tail_widget.text, what="the thinking in the tail")
        assert msg.thinking_block is not None and msg.tail_widget.has_class("thinking")
        await pilot.press("escape")  # stopped while it thinks
        await wait_until(pilot, lambda: not chat.generating)
        block = msg.thinking_block
        assert not block.collapsed and block.title.startswith("Thinking, stopped (")
        assert block.text.startswith("Okay, so three") and msg.body.source == ""


async def test_a_reply_capped_while_it_thinks_says_to_raise_the_cap(tmp_path):
    """A reasoning model thinks for hundreds of tokens: a reply that reaches the cap inside its
    thinking keeps the block open and says how to get the answer; one capped in its answer does
    not."""
    thinking = "<think>\n" + " ".join(f"step{i}" for i in range(40))
    answered = "<think>\nshort\n</think>\n\n" + " ".join(["word"] * 40)
    async with ready_chat(tmp_path, [thinking, answered], {"max_tokens": 12}) as (app, pilot, _):
        chat = app.chat_screen
        chat.prompt.text = "Think hard"
        await pilot.press("enter")
        await notified(pilot, "12-token cap while the model was still thinking", "(F3)")
        msg = chat.chat_view.messages()[-1]
        assert msg.still_thinking and not msg.thinking_block.collapsed
        assert msg.thinking_block.title.startswith("Thinking, stopped (")
        await wait_until(pilot, lambda: not chat.generating)
        chat.prompt.text = "Again"
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(chat.chat_view.messages()) == 4 and not chat.generating)
        await pilot.pause()
        last = chat.chat_view.messages()[-1]
        assert not last.still_thinking and last.thinking_block.collapsed
        assert sum("still thinking" in n for n in notifications(app)) == 1
