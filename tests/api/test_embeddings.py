"""Embeddings: the engine's pooled hidden states (llmd_session_embed) against llama.cpp's
llama-embedding on a tiny random-weight qwen3 embedding model, llmd/api/embeddings.py's pure
parts, and POST /v1/embeddings on a server running that model."""
from __future__ import annotations

import base64
import math
import struct
from pathlib import Path

import pytest

from llmd.api.embeddings import body, encode, input_ids, normalize
from llmd.engine.native import Engine, EngineError
from tests.conformance.client import Client
from tests.conftest import running_llmd
from tests.support.gguf_writer import BOOL, U32, TinyLlama, write_tiny_llama

N_CTX = 128
POOLINGS = {"mean": 1, "cls": 2, "last": 3}
TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "a"]
# llama.cpp and llmd agree to these on F32 weights (measured: cosine >= 0.9999987, max
# difference 4.4e-4, with CLS pooling exact to 1.4e-7): both keep keys and values as f16,
# rounded from sums taken in different orders.
MIN_COSINE = 0.9999
MAX_DIFFERENCE = 2e-3


def build(path: Path, pooling: str, **metadata) -> TinyLlama:
    """The tiny qwen3 embedding model: `pooling` as the file declares it, EOS added to
    every input (as Qwen3-Embedding's tokenizer does), `metadata` (key: (type, value))
    on top."""
    extra = [("qwen3.pooling_type", U32, POOLINGS.get(pooling, 0)), ("tokenizer.ggml.add_eos_token", BOOL, True)]
    extra += [(key, vtype, value) for key, (vtype, value) in metadata.items()]
    return write_tiny_llama(path, arch="qwen3", seed=20, n_ctx=N_CTX, name=f"tiny-qwen3-embedding-{pooling}",
                            extra_metadata=extra)


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


# ---- the engine against llama.cpp -------------------------------------------------------

@pytest.mark.parametrize("pooling", sorted(POOLINGS))
def test_pooled_embeddings_match_llama_embedding(tmp_path, pooling):
    with Engine(str(build(tmp_path / "m.gguf", pooling).path), n_ctx=N_CTX, max_sessions=2) as engine:
        assert engine.pooling_type() == POOLINGS[pooling]
        with engine.new_session() as session:
            for text, golden in zip(TEXTS, GOLDEN[pooling]):
                vector = normalize(session.embed(input_ids(engine.tokenize(text), None, engine.info.eos_id)))
                worst = max(abs(x - y) for x, y in zip(vector, golden))
                assert cosine(vector, golden) >= MIN_COSINE and worst <= MAX_DIFFERENCE, (text, worst)


def test_an_embedding_does_not_depend_on_what_the_session_held_before(tmp_path):
    with Engine(str(build(tmp_path / "m.gguf", "mean").path), n_ctx=N_CTX, max_sessions=2) as engine:
        with engine.new_session() as session:
            ids = engine.tokenize(TEXTS[1])
            first = session.embed(ids)
            session.prefill(engine.tokenize("something else entirely"))
            assert session.embed(ids) == first and session.position == len(ids)


def test_an_input_is_lent_to_no_scope_of_the_prefix_cache(tmp_path):
    # The session last joined scope "a" (a chat of that key); what it embeds afterwards,
    # maybe for another key, must not come back to "a" as a cached prefix.
    with Engine(str(build(tmp_path / "m.gguf", "last").path), n_ctx=N_CTX, max_sessions=3,
                prefix_cache_bytes=1 << 20) as engine:
        ids = engine.tokenize(TEXTS[1] * 3)
        with engine.new_session() as chat, engine.new_session() as probe:
            assert chat.share_prefix("a", ids[:5], 0) == 0
            chat.prefill(ids[:5])
            chat.embed(ids)
            assert chat.position == len(ids)
            assert probe.share_prefix("a", ids + [1], 0) == 0


def test_cls_pooling_of_an_input_longer_than_a_forward_batch_is_its_first_token_alone(tmp_path):
    # Causal attention: the first token sees only itself, however many chunks follow it.
    with Engine(str(build(tmp_path / "m.gguf", "cls").path), n_ctx=4 * N_CTX, max_sessions=2) as engine:
        with engine.new_session() as session:
            ids = (engine.tokenize(TEXTS[1]) * 50)[:3 * N_CTX]
            assert session.embed(ids) == session.embed(ids[:1])


@pytest.mark.parametrize("pooling, metadata, message", [
    ("none", {}, "declares no pooling"),
    ("rank", {"qwen3.pooling_type": (U32, 4)}, "rank pooling"),
    ("last", {"qwen3.attention.causal": (BOOL, False)}, "qwen3.attention.causal is false"),
])
def test_what_the_engine_cannot_embed_is_refused_with_the_reason(tmp_path, pooling, metadata, message):
    with Engine(str(build(tmp_path / "m.gguf", pooling, **metadata).path), n_ctx=N_CTX, max_sessions=2) as engine:
        with engine.new_session() as session, pytest.raises(EngineError, match=message):
            session.embed([1, 2])


def test_embed_refuses_bad_ids_and_lengths(tmp_path):
    with Engine(str(build(tmp_path / "m.gguf", "last").path), n_ctx=N_CTX, max_sessions=2) as engine:
        with engine.new_session() as session:
            for ids, message in (([], "at least one token"), ([1, engine.info.n_vocab], "outside the vocabulary"),
                                 ([1] * (N_CTX + 1), "do not fit the context")):
                with pytest.raises(EngineError, match=message):
                    session.embed(ids)


# ---- llmd/api/embeddings.py -------------------------------------------------------------------

def test_vectors_are_l2_normalised_and_base64_is_little_endian_float32():
    assert normalize([3.0, 4.0]) == [0.6, 0.8] and normalize([0.0, 0.0]) == [0.0, 0.0]
    packed = encode([0.5, -2.0], "base64")
    assert struct.unpack("<2f", base64.b64decode(packed)) == (0.5, -2.0)
    assert encode([0.5], "float") == [0.5]
    assert input_ids([5, 6], 1, 2) == [1, 5, 6, 2] and input_ids([5], None, None) == [5]
    assert body([[1.0]], "float", "m", 3) == {
        "object": "list", "model": "m", "data": [{"object": "embedding", "index": 0, "embedding": [1.0]}],
        "usage": {"prompt_tokens": 3, "total_tokens": 3}}


# ---- POST /v1/embeddings --------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(tmp_path_factory) -> TinyLlama:
    return build(tmp_path_factory.mktemp("embedding") / "last.gguf", "last")


@pytest.fixture(scope="module")
def server(model):
    with running_llmd("--model", str(model.path), "--ctx", str(N_CTX), "--max-sessions", "2") as url:
        yield Client(url + "/v1", model="last")  # the served id is the file name


def tokens(server: Client, text: str) -> list[int]:
    return server.post_json(server.origin + "/tokenize", {"content": text}).json()["tokens"]


def test_the_route_answers_openai_shaped_normalised_vectors_in_input_order(server):
    reply = server.post_json("/embeddings", {"model": server.model, "input": TEXTS})
    assert reply.status == 200, reply.json()
    out = reply.json()
    assert out["object"] == "list" and out["model"] == server.model
    assert [d["index"] for d in out["data"]] == [0, 1, 2]
    for d, golden in zip(out["data"], GOLDEN["last"]):
        assert d["object"] == "embedding" and abs(math.fsum(x * x for x in d["embedding"]) - 1.0) < 1e-9
        assert cosine(d["embedding"], golden) >= MIN_COSINE
    n = sum(len(tokens(server, t)) + 1 for t in TEXTS)  # each text's tokens and its EOS
    assert out["usage"] == {"prompt_tokens": n, "total_tokens": n}


def test_token_arrays_run_as_given_and_base64_holds_the_same_floats(server, model):
    text = server.post_json("/embeddings", {"model": server.model, "input": "Hello world"}).json()
    ids = tokens(server, "Hello world") + [model.eos_id]
    packed = server.post_json("/embeddings", {"model": server.model, "input": [ids], "encoding_format": "base64",
                                              "dimensions": model.n_embd}).json()
    vector = struct.unpack(f"<{model.n_embd}f", base64.b64decode(packed["data"][0]["embedding"]))
    assert packed["usage"]["prompt_tokens"] == len(ids) == text["usage"]["prompt_tokens"]
    assert max(abs(x - y) for x, y in zip(vector, text["data"][0]["embedding"])) < 1e-6  # float32 rounding


def test_embeddings_interleave_with_a_chat_on_the_same_server(server):
    chat = server.post_json("/chat/completions", server.chat_body([{"role": "user", "content": "Hi"}], max_tokens=3))
    assert chat.status == 200 and chat.json()["usage"]["completion_tokens"] >= 1
    assert server.post_json("/embeddings", {"model": server.model, "input": "Hi"}).status == 200
    again = server.post_json("/chat/completions", server.chat_body([{"role": "user", "content": "Hi"}], max_tokens=3))
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the cache held the embedding


def test_a_model_whose_embeddings_the_engine_cannot_compute_is_400_with_the_reason(tmp_path):
    model = build(tmp_path / "noncausal.gguf", "last", **{"qwen3.attention.causal": (BOOL, False)})
    with running_llmd("--model", str(model.path), "--ctx", str(N_CTX)) as url:
        reply = Client(url + "/v1").post_json("/embeddings", {"model": "noncausal", "input": "Hi"})
    error = reply.json()["error"]
    assert reply.status == 400 and (error["code"], error["param"]) == ("unsupported_parameter", "model")
    assert "qwen3.attention.causal is false" in error["message"]


@pytest.mark.parametrize("fields, status, param", [
    ({"input": "x", "dimensions": 32}, 400, "dimensions"),
    ({"input": [[1], [300]]}, 400, "input[1][0]"),
    ({"input": "word " * 200}, 400, "input"),
    ({"input": ""}, 400, "input"),
])
def test_bad_embedding_requests_are_400_naming_the_field(server, fields, status, param):
    reply = server.post_json("/embeddings", {"model": server.model, **fields})
    assert reply.status == status and reply.json()["error"]["param"] == param, reply.json()
GOLDEN = {
    'mean': [
        [0.0576234, 0.1549865, -0.2276017, 0.2222478, 0.0687695, 0.0337818, -0.0235535, 0.1962887, -0.0965536, -0.2441020, 0.1540875, -0.1381893, -0.2059361, 0.0240181, -0.1378089, -0.1529574, -0.0675367, -0.1886163, -0.1467432, 0.1282983, -0.0443463, 0.1206364, 0.0486331, -0.0261863, -0.0439572, -0.1244518, 0.0099472, 0.0876322, 0.2214044, -0.0950546, -0.0558588, 0.0918580, 0.0199413, -0.0026558, -0.1100132, -0.1352369, 0.0610337, 0.0160286, 0.0072549, 0.1051751, -0.0289143, -0.0416724, -0.1558809, -0.0913041, 0.0149886, 0.1712213, -0.0350258, 0.0689352, -0.0120812, 0.1177472, 0.0152221, -0.0869391, 0.2625165, 0.1329971, -0.0355274, -0.3529128, 0.1420759, 0.0142078, 0.0665407, 0.1224895, 0.1195291, -0.1785985, 0.0050324, -0.0029784],
        [0.2450349, 0.1178118, -0.1405270, 0.0253036, 0.0858760, -0.1252620, -0.1333093, -0.0035704, -0.0741543, -0.1289660, 0.1157376, 0.0317500, -0.2206044, 0.0087336, -0.1110841, -0.1833467, -0.0014378, 0.1395194, -0.3432175, -0.1446808, -0.1682607, -0.0437143, -0.1839356, -0.1453587, 0.0544168, -0.1463841, 0.0140456, -0.0036410, 0.0129928, 0.0599549, 0.2472148, 0.0327582, 0.1290016, 0.0120599, -0.0105241, 0.0597750, -0.0121425, 0.0580848, -0.1118436, -0.1288978, 0.0040089, -0.0674376, -0.0889258, 0.0440774, -0.0416069, 0.2094294, -0.0859974, -0.0431963, -0.0131753, -0.0147113, 0.0192895, 0.2358816, 0.1147441, 0.0933068, 0.1595110, -0.0604422, -0.1319434, 0.0511652, 0.0837178, -0.1476797, 0.2463770, -0.2301767, 0.0241185, -0.0825192],
        [0.0611614, -0.0807920, 0.0048640, -0.2088039, -0.0457694, 0.0722852, 0.2466667, -0.2830675, -0.0842524, 0.2741748, -0.0331947, 0.0651956, 0.0103260, -0.0509452, 0.0517908, 0.1064248, 0.1606391, -0.1361551, 0.0398280, 0.0613142, -0.0823452, 0.0769137, -0.1257731, 0.1448300, 0.0939884, -0.0574715, 0.0647356, -0.0225479, 0.0620519, 0.0258735, 0.1098899, -0.2155281, -0.1098640, -0.1469634, 0.1045999, -0.1237644, -0.1925580, -0.0127978, 0.1455231, -0.1180892, -0.0678811, 0.0587561, -0.1138249, -0.0608295, 0.0126359, 0.1797175, 0.0331661, -0.0311501, -0.1360346, -0.0311475, -0.1721991, -0.0429467, 0.0753959, -0.0195220, 0.3741824, -0.1778010, 0.1093358, 0.0330411, 0.0810652, -0.0274062, -0.2117067, -0.1669566, 0.0330683, -0.0079954],
    ],
    'cls': [
        [0.0343916, 0.1978890, -0.0146018, 0.0687006, 0.0093356, 0.1603755, 0.0098154, 0.1289133, -0.0589209, -0.0625446, 0.0866281, -0.0886996, -0.1737231, 0.0417002, -0.0824070, -0.0705899, 0.1367877, -0.0408766, -0.1178782, 0.2430986, 0.0044605, 0.1671712, 0.0991466, -0.1381565, -0.0248352, -0.0436933, -0.1672536, 0.0120738, 0.2112685, -0.0922386, -0.0764196, 0.2063742, -0.2229276, -0.0062763, -0.2185322, -0.0324614, 0.0871351, 0.1806432, -0.0540580, -0.1511799, -0.2073852, -0.0530305, 0.0521164, -0.2260854, -0.0151366, 0.0838853, -0.0039398, 0.1880190, 0.0101793, 0.0058607, 0.0787082, -0.2014849, 0.1377556, 0.0593763, -0.0161753, -0.2407277, 0.1661818, -0.1242086, -0.0033226, 0.1917201, 0.0683516, -0.0206345, 0.1887008, -0.0910264],
        [0.2254340, -0.1191630, -0.1561593, 0.0584807, -0.0160215, -0.1379754, 0.0338311, -0.0318703, 0.0721077, -0.1241949, -0.0980790, 0.0240259, -0.2696635, 0.0676895, -0.0092605, -0.1522212, -0.0852428, -0.0375371, -0.0566246, -0.0291086, -0.0939110, 0.0760546, -0.0972121, -0.2405668, -0.0208105, -0.1306675, -0.3942462, -0.0924655, -0.0708336, 0.0619853, 0.1646246, -0.0256111, -0.0770268, 0.1461357, 0.0838069, 0.0960215, 0.0097388, 0.0845077, -0.1195293, -0.1516857, -0.1256558, -0.1071854, -0.1609838, -0.1405580, -0.0176337, 0.0946165, -0.2376464, -0.1052594, -0.0858773, -0.0967908, -0.0647335, 0.1516978, 0.0086345, 0.0551256, 0.1134381, 0.0965460, -0.3153636, 0.0292484, 0.0003218, -0.0608708, 0.0246675, -0.0779988, -0.1261779, 0.0887257],
        [0.0658030, 0.0024910, -0.0318553, -0.1484129, 0.0458634, 0.0844434, 0.2267576, -0.2430808, 0.0065059, 0.3394444, -0.0674872, 0.0623130, -0.0107923, -0.0024002, -0.0232056, 0.1260222, 0.1622742, -0.0407292, 0.0536387, 0.1076734, -0.1429094, 0.1070553, -0.2121315, 0.1620030, 0.0774696, -0.0100750, 0.0041238, -0.0740932, 0.0659261, 0.0077653, 0.1642354, -0.2326131, -0.1540895, -0.0770175, 0.1269145, -0.0966865, -0.1404317, 0.0181068, 0.1101905, -0.1711053, -0.1097687, 0.0498729, -0.0352787, -0.0275571, 0.0336204, 0.2092519, 0.0670403, 0.0181232, -0.0359981, -0.0302576, -0.1464186, -0.0742400, 0.0678610, 0.1240499, 0.3439721, -0.1734325, 0.0420187, -0.0134536, 0.0309203, -0.1375854, -0.2371163, -0.0110489, 0.0829525, -0.0667681],
    ],
    'last': [
        [-0.0591103, -0.0364768, -0.1053695, 0.0367272, 0.1403982, -0.1214505, 0.0247354, 0.1631746, -0.1458729, -0.1706952, 0.0427178, -0.2349094, -0.1615813, -0.0245233, -0.1733707, -0.0931725, -0.1783517, -0.0947421, -0.2231894, -0.0455427, -0.0001606, -0.0145602, -0.2129917, 0.0804810, -0.0324697, -0.2907003, 0.0235943, 0.1178749, 0.1417694, -0.0336314, -0.0769332, -0.1053840, 0.1090350, 0.0864336, 0.0369738, -0.0645720, 0.0182257, -0.0917125, 0.1067215, 0.1614787, 0.0726666, 0.0115560, -0.0166138, -0.0895370, 0.0157435, 0.0508297, -0.1181648, -0.1573480, -0.0219409, 0.2280679, 0.0047169, -0.0762029, 0.2108973, 0.1936509, -0.0452426, -0.2809036, 0.0511836, 0.0453909, 0.0396775, -0.1069749, 0.1743172, -0.2050342, -0.1252905, 0.1082405],
        [-0.0202051, 0.0692810, -0.0874747, -0.1876699, -0.0614320, 0.0825800, -0.0628953, 0.0505696, -0.2600046, -0.0907152, 0.1549034, -0.1081841, -0.0458598, -0.1477287, -0.0804076, -0.0352868, -0.0462191, -0.0437777, -0.0926288, 0.1207840, -0.0233418, -0.1077498, -0.2590376, -0.0757175, 0.1250529, 0.0619217, 0.1345361, 0.1821637, 0.2134912, 0.0599793, 0.0699775, -0.1702756, -0.0885960, 0.0139774, -0.0998458, -0.0878207, 0.1533089, -0.2046907, 0.0695710, -0.1766212, 0.0181798, 0.1918528, 0.2176574, 0.0441148, 0.0214118, 0.1366106, -0.0299968, -0.1815005, -0.0471136, -0.0572086, -0.0874479, -0.0490500, 0.0503540, -0.0752346, 0.0243336, 0.0408881, 0.2810360, -0.1138599, -0.1003967, -0.1990469, 0.1328156, -0.2689688, 0.0352259, -0.0123669],
        [0.0442230, -0.1488938, 0.0410460, -0.2281195, -0.1293302, 0.0455142, 0.2174409, -0.2668720, -0.1592256, 0.1532524, 0.0081494, 0.0550632, 0.0296285, -0.0898701, 0.1173122, 0.0652931, 0.1268320, -0.2054628, 0.0178813, 0.0021319, -0.0045797, 0.0310193, -0.0132145, 0.0984645, 0.0918914, -0.0939282, 0.1131104, 0.0341230, 0.0457117, 0.0390182, 0.0329037, -0.1551011, -0.0431233, -0.1883251, 0.0610841, -0.1263921, -0.2067623, -0.0415081, 0.1521485, -0.0408070, -0.0119091, 0.0559846, -0.1705219, -0.0823221, -0.0111271, 0.1138609, -0.0077489, -0.0747741, -0.2100320, -0.0258137, -0.1638196, -0.0026855, 0.0679295, -0.1608925, 0.3298575, -0.1466338, 0.1555689, 0.0734750, 0.1155805, 0.0895678, -0.1436211, -0.2912999, -0.0240275, 0.0530761],
    ],
}
