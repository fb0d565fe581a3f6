import pytest

from llmd import errors
from llmd.errors import ApiError, as_api_error, error_body


def fields(err: ApiError) -> tuple:
    return err.status, err.type, err.param, err.code


def test_error_body_always_has_all_four_keys_even_when_null():
    body = error_body(errors.server_error())
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["param"] is None


def test_error_body_carries_the_error_fields():
    err = errors.invalid_request("bad temperature", "temperature")
    assert error_body(err) == {"error": {"message": "bad temperature", "type": "invalid_request_error",
                                         "param": "temperature", "code": "invalid_value"}}


def test_api_error_is_an_exception_with_its_message():
    err = errors.invalid_json()
    with pytest.raises(ApiError) as info:
        raise err
    assert str(info.value) == err.message


@pytest.mark.parametrize("err, expected", [
    (errors.invalid_request("m", "p"), (400, "invalid_request_error", "p", "invalid_value")),
    (errors.invalid_request("m", "p", code=None), (400, "invalid_request_error", "p", None)),
    (errors.invalid_json(), (400, "invalid_request_error", None, "invalid_json")),
    (errors.invalid_type("n", "an integer", "x"), (400, "invalid_request_error", "n", "invalid_type")),
    (errors.missing_parameter("model"), (400, "invalid_request_error", "model", "missing_required_parameter")),
    (errors.unknown_parameter("foo"), (400, "invalid_request_error", "foo", "unknown_parameter")),
    (errors.unsupported_parameter("n"), (400, "invalid_request_error", "n", "unsupported_parameter")),
    (errors.context_length_exceeded(5000, 2048),
     (400, "invalid_request_error", "messages", "context_length_exceeded")),
    (errors.invalid_session_id("bad"), (400, "invalid_request_error", "session_id", "invalid_session_id")),
    (errors.unsupported_session(), (400, "invalid_request_error", "session_id", "unsupported_session")),
    (errors.authentication(), (401, "authentication_error", None, "invalid_api_key")),
    (errors.not_found("nope"), (404, "not_found_error", None, "not_found")),
    (errors.model_not_found("gpt-9"), (404, "not_found_error", "model", "model_not_found")),
    (errors.session_not_found("s1"), (404, "not_found_error", "session_id", "session_not_found")),
    (errors.method_not_allowed(["GET"]), (405, "invalid_request_error", None, "method_not_allowed")),
    (errors.capacity_exhausted(), (429, "capacity_error", None, "capacity_exhausted")),
    (errors.unavailable(), (503, "unavailable_error", None, "unavailable")),
    (errors.server_error(), (500, "server_error", None, "server_error")),
])
def test_each_helper_maps_to_its_status_type_param_and_code(err, expected):
    assert fields(err) == expected


def test_context_length_message_names_both_counts():
    msg = errors.context_length_exceeded(5000, 2048).message
    assert "5000" in msg and "2048" in msg


def test_unknown_and_not_found_messages_name_the_thing():
    assert "'foo'" in errors.unknown_parameter("foo").message
    assert "gpt-9" in errors.model_not_found("gpt-9").message
    assert "s1" in errors.session_not_found("s1").message


def test_method_not_allowed_sets_allow_header():
    err = errors.method_not_allowed(["GET", "DELETE"])
    assert err.headers == {"Allow": "GET, DELETE"}


def test_authentication_asks_for_bearer():
    assert errors.authentication().headers == {"WWW-Authenticate": "Bearer"}


def test_capacity_exhausted_sets_retry_after_in_whole_seconds():
    assert errors.capacity_exhausted(3).headers == {"Retry-After": "3"}
    assert errors.capacity_exhausted(2.7).headers == {"Retry-After": "2"}
    assert errors.capacity_exhausted(-5).headers == {"Retry-After": "0"}


def test_unavailable_has_retry_after_only_when_given():
    assert errors.unavailable().headers == {}
    assert errors.unavailable("loading", retry_after=5).headers == {"Retry-After": "5"}


def test_as_api_error_passes_api_errors_through():
    err = errors.model_not_found("x")
    assert as_api_error(err) is err


def test_as_api_error_turns_other_exceptions_into_500_with_their_reason():
    err = as_api_error(RuntimeError("llmd_prefill: token id 99999 out of range"))
    assert fields(err) == (500, "server_error", None, "server_error")
    assert "token id 99999 out of range" in err.message


def test_as_api_error_names_the_type_of_a_messageless_exception():
    assert "MemoryError" in as_api_error(MemoryError()).message


def test_as_api_error_truncates_huge_messages():
    assert len(as_api_error(ValueError("x" * 10000)).message) < 600


def test_headers_are_copied_not_shared():
    h = {"Retry-After": "1"}
    err = ApiError(429, "m", headers=h)
    h["X"] = "y"
    assert err.headers == {"Retry-After": "1"}


def test_anthropic_error_body_has_anthropic_shape_and_type_by_status():
    assert error_body(errors.invalid_request("bad", "top_k"), errors.ANTHROPIC) == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    assert error_body(errors.capacity_exhausted(), errors.ANTHROPIC)["error"]["type"] == "rate_limit_error"
    assert error_body(errors.unavailable(), errors.ANTHROPIC)["error"]["type"] == "overloaded_error"
    assert error_body(errors.server_error(), errors.ANTHROPIC)["error"]["type"] == "api_error"
    assert error_body(errors.unsupported_media_type("json"), errors.ANTHROPIC)["error"]["type"] == \
        "invalid_request_error"  # every other 4xx


def test_refusal_log_names_code_param_and_quoted_reason():
    fields = errors.refusal_log(errors.invalid_request('bad "x"\nvalue', "temperature"))
    assert fields == {"error": "invalid_value", "param": "temperature", "reason": '"bad \\"x\\"\\nvalue"'}
    assert "param" not in errors.refusal_log(errors.invalid_json())
