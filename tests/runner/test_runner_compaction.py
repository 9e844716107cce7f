"""History compaction: older function-response payloads stripped, the latest untouched."""

from __future__ import annotations

from agentrun_runner.compaction import compact_history, strip_large_strings
from google.genai import types

BLOB = "A" * 4000
SMALL = "B" * 3999


def response(name: str, payload: object) -> types.Content:
    return types.Content(role="user", parts=[types.Part(
        function_response=types.FunctionResponse(name=name, response={"result": payload}))])


def test_strings_of_4000_chars_or_more_are_stripped_at_any_depth() -> None:
    value = {"a": BLOB, "b": [SMALL, {"c": BLOB + "x"}], "n": 3}
    stripped, changed = strip_large_strings(value)
    assert changed
    assert stripped == {"a": "<stripped: 4000 chars>",
                        "b": [SMALL, {"c": "<stripped: 4001 chars>"}], "n": 3}
    assert value["a"] == BLOB  # the input is not modified


def test_all_but_the_latest_content_are_compacted() -> None:
    user = types.Content(role="user", parts=[types.Part(text=BLOB)])
    older = response("read_file", BLOB)
    latest = response("read_file", {"data": BLOB})
    out = compact_history([user, older, latest])
    assert out[0] is user  # text is not a function response
    assert out[1].parts is not None and out[1].parts[0].function_response is not None
    assert out[1].parts[0].function_response.response == {"result": "<stripped: 4000 chars>"}
    assert out[2] is latest
    assert out[2].model_dump_json() == latest.model_dump_json()  # byte for byte
    # The session's own content objects are never mutated.
    assert older.parts is not None and older.parts[0].function_response is not None
    assert older.parts[0].function_response.response == {"result": BLOB}


def test_small_payloads_and_single_contents_are_left_alone() -> None:
    small = response("read_file", SMALL)
    only = response("read_file", BLOB)
    assert compact_history([small, only]) == [small, only]
    assert compact_history([only]) == [only]
