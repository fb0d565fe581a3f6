"""GET /models and GET /models/{id}."""
from __future__ import annotations

import urllib.parse

import pytest

from .client import Client, assert_error, assert_ok, is_int


@pytest.fixture(scope="module")
def listing(client: Client) -> dict:
    return assert_ok(client.get_json("/models"))


def assert_model(model: dict) -> None:
    assert isinstance(model, dict), model
    assert isinstance(model.get("id"), str) and model["id"], model
    assert model.get("object") == "model", model
    assert is_int(model.get("created")) and model["created"] >= 0, model
    assert isinstance(model.get("owned_by"), str), model


def test_models_list_is_an_object_list(listing):
    assert listing.get("object") == "list"
    assert isinstance(listing.get("data"), list) and listing["data"]


def test_models_list_entries_are_model_objects(listing):
    for model in listing["data"]:
        assert_model(model)


def test_models_list_ids_are_unique(listing):
    ids = [m["id"] for m in listing["data"]]
    assert len(ids) == len(set(ids)), ids


def test_configured_model_is_listed(client, listing):
    assert client.model in [m["id"] for m in listing["data"]]


def test_retrieve_model_returns_the_listed_object(client, listing):
    listed = next(m for m in listing["data"] if m["id"] == client.model)
    got = assert_ok(client.get_json("/models/" + urllib.parse.quote(client.model, safe="/:@")))
    assert_model(got)
    assert got == listed


def test_retrieve_unknown_model_is_404_with_error_body(client):
    assert_error(client.get_json("/models/no-such-model-conformance"), 404)
