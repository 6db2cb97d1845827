"""The model picker (Ctrl+T, and the command palette): the models `adaspark models` lists; choosing one
restarts the engine process on it with a new conversation, and its learned state is the new
model's. The switch runs on the real bundled model (marked `model`); the list alone does not."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from textual.app import App

from adaspark_app.engine.backend import default_model_path
from adaspark_app.engine.worker import EngineConfig
from adaspark_app.gguf_file import read_gguf_header
from adaspark_app.models.entry import ModelEntry
from adaspark_app.store import Store
from adaspark_app.ui.app import AdaSparkApp, factory_with_model
from adaspark_app.ui.screens.model_picker import CURRENT_MARK, ModelPickerScreen
from ui_fakes import read_log, recording, wait_until

SIZE = (100, 30)
REPLY_TIMEOUT = 300.0
PICKED_NAME = b"Pickme2"  # replaces "Smollm2" (same length) in the copy's general.name


def entries() -> list[ModelEntry]:
    return [
        ModelEntry("broken/one.gguf", "folder", "/x/one.gguf", size=10, problem="not a GGUF file"),
        ModelEntry("tiny:latest", "ollama", "/x/blob", size=2_000_000, architecture="llama",
                   quantisation="Q8_0", has_chat_template=True, turn_format="chat template", learned=True),
        ModelEntry("org/base/b.gguf", "hf", "/x/b.gguf", size=3_000, architecture="gemma3",
                   quantisation="Q4_K_M", has_chat_template=False, turn_format="base model, gemma turns",
                   learned=False),
    ]


class Host(App):
    """Only the picker, over a fixed list (no discovery, no engine)."""

    def __init__(self) -> None:
        super().__init__()
        self.chosen: list = []

    def on_mount(self) -> None:
        self.push_screen(ModelPickerScreen(None, discover=lambda folders: entries()),
                         callback=self.chosen.append)


async def test_picker_lists_models_usable_first_and_refuses_broken_ones():
    app = Host()
    async with app.run_test(size=SIZE) as pilot:
        picker = app.screen
        await wait_until(pilot, lambda: picker.loaded, what="the model list")
        table = picker.table
        assert table.row_count == 3
        names = [str(table.get_row_at(i)[0]) for i in range(3)]
        assert names == ["tiny:latest", "org/base/b.gguf", "broken/one.gguf"]  # broken last
        row = [str(c) for c in table.get_row_at(1)]
        assert "base model, gemma turns" in row and "hugging face" in row and "Q4_K_M" in row
        assert [str(c) for c in table.get_row_at(2)][1] == "broken"  # why: above, when highlighted
        assert str(picker.query_one("#picker-count").render()) == "2 usable, 1 broken (highlight one to see why)."
        table.move_cursor(row=2)
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is picker and app.chosen == []  # a broken entry cannot be chosen
        assert any("cannot be used: not a GGUF file" in n.message for n in app._notifications)
        table.move_cursor(row=1)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.chosen, what="the choice")
        assert app.chosen[0].name == "org/base/b.gguf"


async def test_escape_closes_the_picker_without_a_choice():
    app = Host()
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.screen.loaded)
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.chosen == [None])


def test_factory_with_model_reaches_inside_the_recording_wrapper(tmp_path):
    cfg = EngineConfig(store_path="s.db", n_ctx=1024)
    assert factory_with_model(cfg, "/m.gguf") == EngineConfig(model_path="/m.gguf", store_path="s.db", n_ctx=1024)
    wrapped = factory_with_model(recording(cfg, tmp_path / "log"), "/m.gguf")
    assert wrapped.args[0].model_path == "/m.gguf" and wrapped.args[1] == str(tmp_path / "log")
    assert factory_with_model(lambda: None, "/m.gguf") is None


# ---------------------------------------------------------------------------------- the real switch
def picked_copy(root: Path) -> Path:
    """The bundled model under a Hugging Face cache layout (snapshot symlink -> blob), with its
    general.name changed: another model to the store (a new header hash) and to the header."""
    src = Path(default_model_path())
    repo = root / "models--acme--Picked-GGUF"
    blob = repo / "blobs" / ("0" * 64)
    blob.parent.mkdir(parents=True)
    shutil.copyfile(src, blob)
    head = read_gguf_header(blob, skip_arrays=True)
    name = head.kv["general.name"].encode()
    with open(blob, "r+b") as fh:
        header = fh.read(head.data_offset)
        at = header.index(name, header.index(b"general.name"))
        fh.seek(at)
        fh.write(PICKED_NAME + name[len(PICKED_NAME):])
    snap = repo / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "picked-Q4_1.gguf").symlink_to(Path("../../blobs") / blob.name)
    return snap / "picked-Q4_1.gguf"


@pytest.mark.model
async def test_picker_switches_model_with_a_new_conversation_and_its_learned_state(tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    picked = picked_copy(hub)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))  # the UI's discovery and the engine process see it
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    # one file for chats and learned state, as `adaspark chat` runs (the UI and engine processes share it)
    learned = str(tmp_path / "adaspark.db")
    log = tmp_path / "calls.jsonl"
    chats = Store.open(learned)
    app = AdaSparkApp(recording(EngineConfig(store_path=learned, n_ctx=1024), log), chats,
                      store_label="chats.db", export_dir=tmp_path, max_tokens=12, exit_on_load_error=False,
                      engine_log=str(tmp_path / "engine.log"))
    try:
        async with app.run_test(size=SIZE) as pilot:
            chat = app.chat_screen
            await wait_until(pilot, lambda: app.engine.ready, timeout=REPLY_TIMEOUT, what="the first engine")
            assert "Pickme2" not in app.model_label
            first_pid = app.engine.pid
            await pilot.press("ctrl+t")
            await wait_until(pilot, lambda: isinstance(app.screen, ModelPickerScreen) and app.screen.loaded,
                             what="the picker")
            picker = app.screen
            names = [e.name for e in picker.entries]
            row = names.index("acme/Picked-GGUF/picked-Q4_1.gguf")
            assert str(picker.table.get_row_at(names.index("SmolLM2-135M-Instruct (bundled)"))[0]).startswith(
                CURRENT_MARK)
            picker.table.move_cursor(row=row)
            await pilot.press("enter")
            await wait_until(pilot, lambda: app.engine.ready and app.switching_to is None and
                             "Pickme2" in app.model_label, timeout=REPLY_TIMEOUT,
                             what=lambda: f"the picked model ({app.model_label}, {app.load_error})")
            assert app.engine.pid != first_pid
            assert app.model_path == str(picked) and "Pickme2" in app.sub_title
            assert chat.conversation.id is None and chat.chat_view.messages() == []
            chat.prompt.text = "What is the capital of France?"
            chat.prompt.focus()
            await pilot.press("enter")
            await wait_until(pilot, lambda: chat.conversation.id and not chat.generating,
                             timeout=REPLY_TIMEOUT, what="the reply on the picked model")
            reply = chat.chat_view.messages()[-1]
            assert reply.text.strip()
    finally:
        chats.close()
    loads = read_log(log, "load")
    generated = read_log(log, "generate")
    assert len(loads) == 2 and loads[1]["pid"] != loads[0]["pid"]
    assert [g["pid"] for g in generated] == [loads[1]["pid"]]  # the reply came from the new engine
    with Store.open(learned) as store:
        names = [r["model_name"] for r in store.list_learned()]
    assert any("Pickme2" in n for n in names), names  # learned under the picked model's key
    import sqlite3

    conn = sqlite3.connect(learned)
    try:  # the switch, the picker and both engines' writes left the shared file whole
        assert conn.execute("pragma integrity_check").fetchall() == [("ok",)]
        assert conn.execute("select count(*) from conversations").fetchone()[0] == 1
    finally:
        conn.close()


@pytest.fixture
def hollow_folder(tmp_path, monkeypatch) -> Path:
    """The only models listed: the bundled one and `hollow.gguf`, a llama header with 2 of its
    tensors (it passes the list's checks; llama.cpp cannot load it)."""
    from model_trees import write_gguf

    write_gguf(tmp_path / "folder" / "hollow.gguf")
    monkeypatch.setenv("ADASPARK_MODELS", str(tmp_path / "folder"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hub"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "folder"


def chat_app(factory, chats: Store, tmp_path: Path) -> AdaSparkApp:
    """The app as `adaspark chat` runs it (exit_on_load_error on: only its first load may end it)."""
    return AdaSparkApp(factory, chats, store_label="chats.db", export_dir=tmp_path, max_tokens=8,
                       exit_on_load_error=True, engine_log=str(tmp_path / "engine.log"))


async def pick(pilot, name: str) -> None:
    """Ctrl+T, then the picker's row named `name`."""
    app = pilot.app
    await pilot.press("ctrl+t")
    await wait_until(pilot, lambda: isinstance(app.screen, ModelPickerScreen) and app.screen.loaded,
                     what="the picker")
    picker = app.screen
    picker.table.move_cursor(row=[e.name for e in picker.entries].index(name))
    await pilot.press("enter")


@pytest.mark.model
async def test_a_picked_model_that_fails_to_load_leaves_the_app_running(tmp_path, hollow_folder):
    """A file whose header passes but that llama.cpp cannot load: the chat says so and stays open,
    and another pick works."""
    chats = Store.open(tmp_path / "chats.db")
    app = chat_app(EngineConfig(store_path=str(tmp_path / "learned.db"), n_ctx=1024), chats, tmp_path)
    try:
        async with app.run_test(size=SIZE) as pilot:
            chat = app.chat_screen
            await wait_until(pilot, lambda: app.engine.ready, timeout=REPLY_TIMEOUT, what="the first engine")
            await pick(pilot, "hollow.gguf")
            await wait_until(pilot, lambda: app.load_error is not None, timeout=REPLY_TIMEOUT,
                             what="the failed load")
            assert app.is_running and app.return_code is None
            assert any("failed to load" in (n.title or "") for n in app._notifications)
            assert not await chat.send("hello")  # refused with a notification, not sent to nobody
            await pick(pilot, "SmolLM2-135M-Instruct (bundled)")
            await wait_until(pilot, lambda: app.engine.ready and app.load_error is None, timeout=REPLY_TIMEOUT,
                             what="the bundled model again")
            assert await chat.send("What is the capital of France?")
            await wait_until(pilot, lambda: not chat.generating, timeout=REPLY_TIMEOUT, what="the reply")
            assert chat.chat_view.messages()[-1].text.strip()
    finally:
        chats.close()


@pytest.mark.model
async def test_a_message_sent_while_a_picked_model_loads_comes_back_when_it_fails(tmp_path, hollow_folder):
    """A message typed while the picked model loads waits for it; when that load fails, the chat
    is not left waiting for ever (Esc did not help): the message is back in the box, nothing is
    stored, and the next model answers only what is sent to it."""
    log = tmp_path / "calls.jsonl"
    chats = Store.open(tmp_path / "chats.db")
    app = chat_app(recording(EngineConfig(store_path=str(tmp_path / "learned.db"), n_ctx=1024), log), chats,
                   tmp_path)
    try:
        async with app.run_test(size=SIZE) as pilot:
            chat = app.chat_screen
            await wait_until(pilot, lambda: app.engine.ready, timeout=REPLY_TIMEOUT, what="the first engine")
            await pick(pilot, "hollow.gguf")
            await wait_until(pilot, lambda: app.screen is chat, what="the chat again")
            assert not app.engine.ready and app.load_error is None  # still loading
            assert await chat.send("lost in the load")
            assert chat.generating
            await wait_until(pilot, lambda: app.load_error is not None, timeout=REPLY_TIMEOUT, what="the failed load")
            await wait_until(pilot, lambda: not chat.generating, what="the waiting reply given back")
            assert chat.prompt.text == "lost in the load"
            assert chat.chat_view.messages() == []
            assert any("your message is back in the box" in n.message for n in app._notifications)
            assert chats.list_conversations() == []
            await pick(pilot, "SmolLM2-135M-Instruct (bundled)")
            await wait_until(pilot, lambda: app.engine.ready and app.load_error is None, timeout=REPLY_TIMEOUT,
                             what="the bundled model again")
            chat.prompt.clear()
            assert await chat.send("What is the capital of France?")
            await wait_until(pilot, lambda: not chat.generating, timeout=REPLY_TIMEOUT, what="the reply")
            asked = read_log(log, "generate")
            assert [c["messages"][-1]["content"] for c in asked] == ["What is the capital of France?"]
    finally:
        chats.close()


async def test_the_highlighted_row_shows_its_file_and_why_it_is_broken():
    app = Host()
    async with app.run_test(size=SIZE) as pilot:
        picker = app.screen
        await wait_until(pilot, lambda: picker.loaded)
        status = picker.query_one("#picker-status")
        await wait_until(pilot, lambda: "/x/blob" in str(status.render()), what="the first row's path")
        picker.table.move_cursor(row=2)
        await wait_until(pilot, lambda: "cannot be used: not a GGUF file" in str(status.render()),
                         what="the broken row's reason")
        assert "/x/one.gguf" in str(status.render())


async def test_picker_shows_control_characters_in_names_as_escapes():
    """A file name is untrusted: ESC in it is shown as `\\x1b`, not sent to the terminal (and not
    silently dropped, which would make two names look alike)."""
    odd = [ModelEntry("evil\x1b]0;x\x07.gguf", "folder", "/x/evil\x1b]0;x\x07.gguf", size=10, architecture="llama",
                      quantisation="Q8_0", has_chat_template=True, turn_format="chat template")]

    class OddHost(App):
        def on_mount(self) -> None:
            self.push_screen(ModelPickerScreen(None, discover=lambda folders: odd))

    app = OddHost()
    async with app.run_test(size=SIZE) as pilot:
        picker = app.screen
        await wait_until(pilot, lambda: picker.loaded, what="the model list")
        assert str(picker.table.get_row_at(0)[0]) == "evil\\x1b]0;x\\x07.gguf"
        await wait_until(pilot, lambda: "/x/evil\\x1b]0;x\\x07.gguf" in str(picker.query_one("#picker-status").render()))


async def test_a_long_reason_and_path_fit_the_picker_at_100_columns():
    """A broken model's reason in the table made it wider than the dialog: at 100 columns the
    STATUS column, last, was cut to "b", and the reason, shown above in two fixed lines, lost its
    end. STATUS is second now and says "broken", in view; the lines above hold the whole path
    and reason."""
    reason = "corrupt GGUF (array tokenizer.ggml.tokens of 49152 cannot fit in the 26399 bytes left)"
    path = "/home/someone/models/lmstudio-community/Some-Model-7B-Instruct-GGUF/Some-Model-7B-Instruct-Q4_K_M.gguf"
    many = [ModelEntry("Some-Model-7B-Instruct-Q4_K_M.gguf", "folder", path, size=4_000_000_000, problem=reason)]

    class LongHost(App):
        def on_mount(self) -> None:
            self.push_screen(ModelPickerScreen(None, discover=lambda folders: [*entries(), *many]))

    app = LongHost()
    async with app.run_test(size=SIZE) as pilot:
        picker = app.screen
        await wait_until(pilot, lambda: picker.loaded, what="the model list")
        table = picker.table
        table.move_cursor(row=3)
        status = picker.query_one("#picker-status")
        await wait_until(pilot, lambda: reason in str(status.render()), what="the reason")
        await pilot.pause()
        columns = list(table.columns.values())
        assert str(columns[1].label) == "STATUS" and str(table.get_row_at(3)[1]) == "broken"
        assert sum(c.get_render_width(table) for c in columns[:2]) <= table.scrollable_content_region.width
        shown = " ".join("".join(seg.text for seg in line).strip() for line in status.render_lines(status.region.reset_offset))
        assert shown.replace(" ", "").endswith(("cannot be used: " + reason).replace(" ", ""))
        assert path.replace(" ", "") in shown.replace(" ", "")
