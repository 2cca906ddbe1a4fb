"""Secondary indexes and queries through the official client: index create /
remove (bin, list, map keys, map values, CDT context and expression indexes),
indexes built over existing records and kept true by later writes, deletes,
truncation and expiry, and the queries that use them (integer ranges, string
and blob equality, collection contains/range, set and namespace scope,
filter expressions, projections, limits, pagination, partition filters), plus
the `sindex*` info commands.

Every record is written with POLICY_KEY_SEND so a query's answer can be
compared as the exact set of user keys. Each index create costs the client
about 2 s (it polls `sindex/NS/NAME` every 2 s until load_pct=100), so the
read-only query tests share one module-scoped data set and its indexes, and the
write-path tests share module-scoped whole-namespace indexes on bin names no
other test uses, each test working in its own set.

Not covered (not supported by citrined): UDF / aggregation queries. Background query
execution is checked to either be refused (16) or write exactly the selected
records."""

import time
import uuid

import aerospike
import pytest
from aerospike import exception as ex
from aerospike import predicates as p
from aerospike_helpers import cdt_ctx
from aerospike_helpers import expressions as exp
from aerospike_helpers.batch import records as br
from aerospike_helpers.operations import list_operations as lo
from aerospike_helpers.operations import operations as op

pytestmark = [
    pytest.mark.scan,
    pytest.mark.filterwarnings("ignore:index_.*is deprecated:DeprecationWarning"),
]

NS = "test"
KEY_SEND = {"key": aerospike.POLICY_KEY_SEND}
N_PARTITIONS = 4096


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------

def uid(n=8):
    return uuid.uuid4().hex[:n]


def info1(client, command):
    """The single node's answer to an info command, stripped."""
    answers = client.info_all(command)
    assert len(answers) == 1, answers
    (err, text), = answers.values()
    assert err is None, (command, err)
    return text.strip()


def index_stat(client, name):
    """`sindex/test/NAME` as a dict."""
    text = info1(client, f"sindex/{NS}/{name}")
    out = {}
    for pair in text.strip(";").split(";"):
        k, _, v = pair.partition("=")
        out[k] = v
    return out


def entries(client, name):
    return int(index_stat(client, name)["entries"])


def listing(client):
    """`sindex/test` as {indexname: {field: value}}."""
    text = info1(client, f"sindex/{NS}")
    out = {}
    for entry in filter(None, text.split(";")):
        fields = dict(part.split("=", 1) for part in entry.split(":") if "=" in part)
        out[fields["indexname"]] = fields
    return out


def exists(client, name):
    return info1(client, f"sindex-exists:ns={NS};indexname={name}")


def set_sindexes(client, set_name):
    text = info1(client, f"sets/{NS}/{set_name}")
    fields = dict(part.split("=", 1) for part in text.strip(":;").split(":") if "=" in part)
    return int(fields["sindexes"])


def ukeys(records):
    """Sorted user keys of query results (fails on a missing key)."""
    out = []
    for (key, _meta, _bins) in records:
        assert key[2] is not None, f"record without its user key: {key!r}"
        out.append(key[2])
    return sorted(out)


def run(client, set_name, predicate, ctx=None, policy=None, options=None, select=None,
        max_records=None):
    q = client.query(NS, set_name)
    if ctx is None:
        q.where(predicate)
    else:
        q.where(predicate, ctx)
    if select:
        q.select(*select)
    if max_records is not None:
        q.max_records = max_records
    return q.results(policy or {}, options or {})


def qkeys(client, set_name, predicate, **kw):
    records = run(client, set_name, predicate, **kw)
    keys = ukeys(records)
    assert len(keys) == len(set(keys)), f"a record came back twice: {keys}"
    return keys


def partition_of(digest):
    return int.from_bytes(bytes(digest[:2]), "little") & (N_PARTITIONS - 1)


def batch_put(client, set_name, rows):
    """rows: {user_key: bins}; written with batch_write, keys stored."""
    items = list(rows.items())
    for start in range(0, len(items), 500):
        chunk = items[start:start + 500]
        recs = br.BatchRecords([
            br.Write((NS, set_name, k), [op.write(b, v) for b, v in bins.items()], policy=KEY_SEND)
            for k, bins in chunk
        ])
        client.batch_write(recs)
        for r in recs.batch_records:
            assert r.result == 0, (r.key, r.result)


class Indexes:
    """Creates indexes and removes them at teardown (a name is remembered
    before its create is sent, so a half-made index is removed too)."""

    def __init__(self, client):
        self.client = client
        self.names = []

    def name(self, tag):
        n = f"ix_{tag}_{uid(10)}"
        self.names.append(n)
        return n

    def remove_all(self):
        for n in self.names:
            try:
                self.client.index_remove(NS, n)
            except Exception:
                pass


@pytest.fixture
def indexes(client):
    made = Indexes(client)
    yield made
    made.remove_all()


# --------------------------------------------------------------------------
# Read-only data set (module scope): one set, every index kind
# --------------------------------------------------------------------------

def _data():
    data = {}
    for k in range(24):
        data[k] = {
            "n": k - 10,                                   # -10 .. 13
            "s": ["red", "green", "blue"][k % 3],
            "b": bytearray([k % 4]),
            "l": [k, k + 1, k + 2, f"e{k % 5}"],
            "m": {f"k{k % 6}": k * 10, k: f"v{k % 2}"},
            "nest": {"a": {"b": k % 7}, "l": [[k], [k * 2, k * 2 + 1]]},
        }
    # Values of another type than the indexes': indexed nowhere (except where noted).
    data[24] = {"n": "5", "s": 5, "b": "x", "l": "notalist", "m": [1, 2],
                "nest": {"a": {"b": "str"}, "l": "x"}}
    data[25] = {"n": 5.0, "s": ["red"], "b": 3, "l": [5.0, "5", [6]],
                "m": {"k0": 5.5, "z": "v0"}, "nest": {"a": 5, "l": []}}
    data[26] = {"other": 1}
    return data


DATA = _data()


def _ints(values):
    return [v for v in values if type(v) is int]


def _strs(values):
    return [v for v in values if type(v) is str]


def expect(pred):
    return sorted(k for k, rec in DATA.items() if pred(rec))


def exp_n(lo_, hi):
    return expect(lambda r: type(r.get("n")) is int and lo_ <= r["n"] <= hi)


def exp_list_int(lo_, hi):
    return expect(lambda r: type(r.get("l")) is list and any(lo_ <= v <= hi for v in _ints(r["l"])))


def exp_list_str(value):
    return expect(lambda r: type(r.get("l")) is list and value in _strs(r["l"]))


def exp_map(part, pred):
    def check(r):
        m = r.get("m")
        if type(m) is not dict:
            return False
        values = m.keys() if part == "keys" else m.values()
        return any(pred(v) for v in values)
    return expect(check)


def _nest_b(r):
    try:
        v = r["nest"]["a"]["b"]
    except (KeyError, TypeError):
        return None
    return v if type(v) is int else None


def _nest_last(r):
    try:
        v = r["nest"]["l"][-1]
    except (KeyError, TypeError, IndexError):
        return []
    return _ints(v) if type(v) is list else []


CTX_VALUE = [cdt_ctx.cdt_ctx_map_key("a"), cdt_ctx.cdt_ctx_map_key("b")]
CTX_LIST = [cdt_ctx.cdt_ctx_map_key("l"), cdt_ctx.cdt_ctx_list_index(-1)]
EXPR_N = exp.Add(exp.IntBin("n"), 1000)


class DataSet:
    def __init__(self, set_name, other_set, idx):
        self.set = set_name
        self.other_set = other_set
        self.idx = idx


@pytest.fixture(scope="module")
def ds(client):
    tag = uid(6)
    set_name, other_set = f"sidx{tag}", f"sidxo{tag}"
    batch_put(client, set_name, DATA)
    # Same bins in another set: never returned by the first set's indexes.
    batch_put(client, other_set, {100 + i: {"n": i, "s": "red", "l": [i]} for i in range(5)})
    made = Indexes(client)
    idx = {}

    def mk(tag_, create):
        name = made.name(tag_)
        create(name)
        idx[tag_] = name

    try:
        mk("n", lambda n: client.index_integer_create(NS, set_name, "n", n))
        mk("s", lambda n: client.index_string_create(NS, set_name, "s", n))
        mk("b", lambda n: client.index_blob_create(NS, set_name, "b", n))
        mk("ln", lambda n: client.index_list_create(NS, set_name, "l", aerospike.INDEX_NUMERIC, n))
        mk("ls", lambda n: client.index_list_create(NS, set_name, "l", aerospike.INDEX_STRING, n))
        mk("mks", lambda n: client.index_map_keys_create(NS, set_name, "m", aerospike.INDEX_STRING, n))
        mk("mkn", lambda n: client.index_map_keys_create(NS, set_name, "m", aerospike.INDEX_NUMERIC, n))
        mk("mvn", lambda n: client.index_map_values_create(NS, set_name, "m", aerospike.INDEX_NUMERIC, n))
        mk("mvs", lambda n: client.index_map_values_create(NS, set_name, "m", aerospike.INDEX_STRING, n))
        mk("cv", lambda n: client.index_cdt_create(NS, set_name, "nest", aerospike.INDEX_TYPE_DEFAULT,
                                                   aerospike.INDEX_NUMERIC, n, CTX_VALUE))
        mk("cl", lambda n: client.index_list_create(NS, set_name, "nest", aerospike.INDEX_NUMERIC, n,
                                                    ctx=CTX_LIST))
        mk("e", lambda n: client.index_expr_create(NS, set_name, aerospike.INDEX_TYPE_DEFAULT,
                                                   aerospike.INDEX_NUMERIC, EXPR_N.compile(), n))
        yield DataSet(set_name, other_set, idx)
    finally:
        made.remove_all()


# --------------------------------------------------------------------------
# Queries on the data set
# --------------------------------------------------------------------------

def test_integer_between_and_equals(client, ds):
    s = ds.set
    assert qkeys(client, s, p.between("n", -3, 4)) == exp_n(-3, 4) == list(range(7, 15))
    assert qkeys(client, s, p.between("n", -10, -10)) == [0]
    assert qkeys(client, s, p.equals("n", 13)) == [23]
    assert qkeys(client, s, p.equals("n", 0)) == [10]
    assert qkeys(client, s, p.equals("n", 5)) == [15]  # not 24 ("5") nor 25 (5.0)
    assert qkeys(client, s, p.between("n", 14, 100)) == []
    assert qkeys(client, s, p.between("n", -2**63, 2**63 - 1)) == exp_n(-2**63, 2**63 - 1) \
        == list(range(24))


def test_string_equals(client, ds):
    s = ds.set
    assert qkeys(client, s, p.equals("s", "green")) == [k for k in range(24) if k % 3 == 1]
    assert qkeys(client, s, p.equals("s", "red")) == [k for k in range(24) if k % 3 == 0]
    assert qkeys(client, s, p.equals("s", "gree")) == []
    assert qkeys(client, s, p.equals("s", "purple")) == []


def test_blob_equals(client, ds):
    s = ds.set
    assert qkeys(client, s, p.equals("b", bytearray([2]))) == [k for k in range(24) if k % 4 == 2]
    assert qkeys(client, s, p.equals("b", bytearray([3]))) == [k for k in range(24) if k % 4 == 3]
    assert qkeys(client, s, p.equals("b", bytearray([9]))) == []


def test_list_index_contains_numeric_and_string(client, ds):
    s = ds.set
    li = aerospike.INDEX_TYPE_LIST
    assert qkeys(client, s, p.contains("l", li, 5)) == exp_list_int(5, 5) == [3, 4, 5]
    assert qkeys(client, s, p.contains("l", li, 0)) == [0]
    assert qkeys(client, s, p.contains("l", li, "e3")) == exp_list_str("e3") == [3, 8, 13, 18, 23]
    assert qkeys(client, s, p.contains("l", li, "5")) == [25]  # a string element "5"
    assert qkeys(client, s, p.contains("l", li, "nope")) == []


def test_list_range_returns_each_record_once(client, ds):
    s = ds.set
    records = run(client, s, p.range("l", aerospike.INDEX_TYPE_LIST, 5, 9))
    keys = [r[0][2] for r in records]
    # Records 3..9 hold two or three elements in range each: still once each.
    assert sorted(keys) == exp_list_int(5, 9) == list(range(3, 10))
    assert len(keys) == len(set(keys))
    records = run(client, s, p.range("l", aerospike.INDEX_TYPE_LIST, -100, 100))
    keys = [r[0][2] for r in records]
    assert sorted(keys) == list(range(24)) and len(keys) == 24


def test_map_keys_and_values_indexes(client, ds):
    s = ds.set
    mk, mv = aerospike.INDEX_TYPE_MAPKEYS, aerospike.INDEX_TYPE_MAPVALUES
    assert qkeys(client, s, p.contains("m", mk, "k2")) == exp_map("keys", lambda v: v == "k2") \
        == [2, 8, 14, 20]
    assert qkeys(client, s, p.contains("m", mk, "k0")) == [0, 6, 12, 18, 25]
    assert qkeys(client, s, p.contains("m", mk, 7)) == [7]
    assert qkeys(client, s, p.range("m", mk, 20, 22)) == [20, 21, 22]
    assert qkeys(client, s, p.contains("m", mv, 70)) == [7]
    assert qkeys(client, s, p.range("m", mv, 30, 65)) \
        == exp_map("values", lambda v: type(v) is int and 30 <= v <= 65) == [3, 4, 5, 6]
    assert qkeys(client, s, p.contains("m", mv, "v1")) == [k for k in range(24) if k % 2 == 1]
    assert qkeys(client, s, p.contains("m", mv, "v0")) == [k for k in range(24) if k % 2 == 0] + [25]


def test_cdt_context_indexes(client, ds):
    s = ds.set
    assert qkeys(client, s, p.equals("nest", 3), ctx=CTX_VALUE) \
        == expect(lambda r: _nest_b(r) == 3) == [3, 10, 17]
    assert qkeys(client, s, p.between("nest", 5, 6), ctx=CTX_VALUE) == [5, 6, 12, 13, 19, 20]
    li = aerospike.INDEX_TYPE_LIST
    assert qkeys(client, s, p.range("nest", li, 10, 13), ctx=CTX_LIST) \
        == expect(lambda r: any(10 <= v <= 13 for v in _nest_last(r))) == [5, 6]
    assert qkeys(client, s, p.contains("nest", li, 47), ctx=CTX_LIST) == [23]
    # Without the context, or with another one, no index matches.
    with pytest.raises(ex.IndexNotFound):
        run(client, s, p.equals("nest", 3))
    with pytest.raises(ex.IndexNotFound):
        run(client, s, p.equals("nest", 3), ctx=[cdt_ctx.cdt_ctx_map_key("a")])
    with pytest.raises(ex.IndexNotFound):
        run(client, s, p.range("nest", li, 10, 13), ctx=[cdt_ctx.cdt_ctx_map_key("l"),
                                                          cdt_ctx.cdt_ctx_list_index(0)])


def test_expression_index_by_expression_and_by_name(client, ds):
    s = ds.set
    q = client.query(NS, s)
    q.where_with_expr(EXPR_N.compile(), p.between(None, 995, 1005))
    assert ukeys(q.results()) == exp_n(-5, 5) == list(range(5, 16))
    q = client.query(NS, s)
    q.where_with_index_name(ds.idx["e"], p.equals(None, 1013))
    assert ukeys(q.results()) == [23]
    # An index named explicitly: the bin index, with a filter that names no bin.
    q = client.query(NS, s)
    q.where_with_index_name(ds.idx["n"], p.between(None, 12, 13))
    assert ukeys(q.results()) == [22, 23]
    # Another expression: no index.
    q = client.query(NS, s)
    q.where_with_expr(exp.Add(exp.IntBin("n"), 999).compile(), p.equals(None, 1000))
    with pytest.raises(ex.IndexNotFound):
        q.results()
    q = client.query(NS, s)
    q.where_with_index_name("no_such_index_" + uid(), p.equals(None, 1))
    with pytest.raises(ex.IndexNotFound):
        q.results()


def test_set_index_ignores_other_sets(client, ds):
    # ds.other_set has records with the same bins but no index of its own.
    for predicate in (p.between("n", 0, 4), p.equals("s", "red"),
                      p.contains("l", aerospike.INDEX_TYPE_LIST, 1)):
        with pytest.raises(ex.IndexNotFound):
            run(client, ds.other_set, predicate)
    assert qkeys(client, ds.set, p.between("n", 0, 4)) == [10, 11, 12, 13, 14]
    assert qkeys(client, ds.set, p.equals("s", "red")) == [k for k in range(24) if k % 3 == 0]


def test_query_without_set_does_not_use_a_set_index(client, ds):
    with pytest.raises(ex.IndexNotFound):
        run(client, None, p.between("n", 0, 4))


def test_missing_index_raises_index_not_found(client, ds):
    s = ds.set
    cases = [
        p.between("nobin", 0, 4),                                   # no index on the bin
        p.equals("n", "x"),                                          # n is indexed as numeric only
        p.equals("s", 1),                                            # s is indexed as string only
        p.between("m", 0, 4),                                        # m has map indexes only
        p.contains("n", aerospike.INDEX_TYPE_LIST, 1),               # n has no list index
        p.contains("l", aerospike.INDEX_TYPE_MAPKEYS, "e1"),        # l has list indexes only
    ]
    for predicate in cases:
        with pytest.raises(ex.IndexNotFound) as info:
            run(client, s, predicate)
        assert info.value.code == 201, predicate


def test_filter_expression_with_predicate(client, ds):
    s = ds.set
    # Mod truncates toward zero (C semantics): a negative odd n gives -1.
    odd = {"expressions": exp.Eq(exp.Mod(exp.IntBin("n"), 2), 1).compile()}
    keys = qkeys(client, s, p.between("n", -10, 13), policy=odd)
    assert keys == expect(lambda r: type(r.get("n")) is int and r["n"] > 0 and r["n"] % 2 == 1) \
        == [11, 13, 15, 17, 19, 21, 23]
    red = {"expressions": exp.Eq(exp.StrBin("s"), "red").compile()}
    assert qkeys(client, s, p.between("n", 0, 13), policy=red) == [12, 15, 18, 21]
    nothing = {"expressions": exp.Eq(exp.IntBin("n"), 999).compile()}
    assert qkeys(client, s, p.between("n", -10, 13), policy=nothing) == []
    # Filtered records do not count against max_records.
    keys = qkeys(client, s, p.between("n", -10, 13), policy=red, max_records=3)
    assert len(keys) == 3 and set(keys) <= {0, 3, 6, 9, 12, 15, 18, 21}


def test_select_projects_bins(client, ds):
    s = ds.set
    records = run(client, s, p.between("n", 0, 2), select=["s"])
    assert sorted((r[0][2], tuple(sorted(r[2].items()))) for r in records) == [
        (10, (("s", "green"),)), (11, (("s", "blue"),)), (12, (("s", "red"),))]
    records = run(client, s, p.between("n", 0, 1), select=["n", "b", "nosuchbin"])
    assert sorted((r[0][2], r[2]["n"], bytes(r[2]["b"]), len(r[2])) for r in records) == [
        (10, 0, b"\x02", 2), (11, 1, b"\x03", 2)]
    # Full records when nothing is selected.
    records = run(client, s, p.equals("n", 13))
    assert len(records) == 1
    bins = records[0][2]
    assert bins["n"] == 13 and bins["s"] == DATA[23]["s"] and bins["l"] == DATA[23]["l"]
    assert bins["m"] == DATA[23]["m"] and bins["nest"] == DATA[23]["nest"]


def test_nobins_returns_metadata_only(client, ds):
    records = run(client, ds.set, p.between("n", 0, 3), options={"nobins": True})
    assert ukeys(records) == [10, 11, 12, 13]
    for _key, meta, bins in records:
        assert not bins and meta["gen"] == 1


def test_max_records(client, ds):
    s = ds.set
    for limit in (1, 5, 23):
        keys = qkeys(client, s, p.between("n", -10, 13), max_records=limit)
        assert len(keys) == limit and set(keys) <= set(range(24))
    assert qkeys(client, s, p.between("n", -10, 13), max_records=1000) == list(range(24))
    # A list range: max_records counts distinct records.
    keys = qkeys(client, s, p.range("l", aerospike.INDEX_TYPE_LIST, 0, 100), max_records=10)
    assert len(keys) == 10


def test_results_and_foreach_agree(client, ds):
    s = ds.set
    q = client.query(NS, s)
    q.where(p.between("n", -5, 8))
    from_results = ukeys(q.results())
    seen = []
    q2 = client.query(NS, s)
    q2.where(p.between("n", -5, 8))
    q2.foreach(lambda rec: seen.append(rec))
    assert ukeys(seen) == from_results == exp_n(-5, 8)
    # The same Query object answers the same again.
    assert ukeys(q.results()) == from_results


def test_foreach_stops_when_callback_returns_false(client, ds):
    seen = []

    def callback(rec):
        seen.append(rec[0][2])
        if len(seen) == 3:
            return False
        return True

    q = client.query(NS, ds.set)
    q.where(p.between("n", -10, 13))
    q.foreach(callback)
    assert len(seen) == 3 and set(seen) <= set(range(24))


def _paginate(q, page_size):
    q.max_records = page_size
    q.paginate()
    pages = []
    for _ in range(1000):
        if q.is_done():
            break
        pages.append(q.results())
    else:
        pytest.fail("pagination never finished")
    return pages


@pytest.mark.parametrize("page_size", [1, 4, 7])
def test_paginate_integer_range(client, ds, page_size):
    q = client.query(NS, ds.set)
    q.where(p.between("n", -7, 13))
    pages = _paginate(q, page_size)
    keys = [r[0][2] for page in pages for r in page]
    assert all(len(page) <= page_size for page in pages)
    assert sorted(keys) == exp_n(-7, 13) and len(keys) == len(set(keys))
    assert sum(len(page) == page_size for page in pages) >= len(keys) // page_size


def test_paginate_list_range_with_several_elements_in_range(client, ds):
    q = client.query(NS, ds.set)
    q.where(p.range("l", aerospike.INDEX_TYPE_LIST, 2, 20))
    pages = _paginate(q, 3)
    keys = [r[0][2] for page in pages for r in page]
    assert sorted(keys) == exp_list_int(2, 20) and len(keys) == len(set(keys))


def test_paginate_string_equality(client, ds):
    q = client.query(NS, ds.set)
    q.where(p.equals("s", "blue"))
    pages = _paginate(q, 2)
    keys = [r[0][2] for page in pages for r in page]
    assert sorted(keys) == [k for k in range(24) if k % 3 == 2] and len(keys) == len(set(keys))


def test_partition_filter(client, ds):
    s = ds.set
    halves = []
    for begin, count in ((0, 2048), (2048, 2048)):
        records = run(client, s, p.between("n", -10, 13),
                      policy={"partition_filter": {"begin": begin, "count": count}})
        for key, _, _ in records:
            assert begin <= partition_of(key[3]) < begin + count
        halves.append(ukeys(records))
    assert not set(halves[0]) & set(halves[1])
    assert sorted(halves[0] + halves[1]) == list(range(24))
    # One partition at a time gives each record exactly once.
    some = sorted({partition_of(aerospike.calc_digest(NS, s, k)) for k in range(24)})[:3]
    for pid in some:
        records = run(client, s, p.between("n", -10, 13),
                      policy={"partition_filter": {"begin": pid, "count": 1}})
        expected = [k for k in range(24) if partition_of(aerospike.calc_digest(NS, s, k)) == pid]
        assert ukeys(records) == expected


def test_partition_status_resumes_in_a_new_query(client, ds):
    q = client.query(NS, ds.set)
    q.where(p.range("l", aerospike.INDEX_TYPE_LIST, 0, 100))
    q.max_records = 9
    q.paginate()
    first = ukeys(q.results())
    assert len(first) == 9
    status = q.get_partitions_status()
    q2 = client.query(NS, ds.set)
    q2.where(p.range("l", aerospike.INDEX_TYPE_LIST, 0, 100))
    rest = ukeys(q2.results({"partition_filter": {"begin": 0, "count": N_PARTITIONS,
                                                   "partition_status": status}}))
    assert not set(first) & set(rest)
    assert sorted(first + rest) == list(range(24))


def test_info_commands(client, ds):
    names = listing(client)
    for tag, name in ds.idx.items():
        assert name in names, tag
        assert names[name]["ns"] == NS and names[name]["set"] == ds.set
        assert names[name]["state"] == "RW"
        assert "load_pct=100" in info1(client, f"sindex/{NS}/{name}")
        assert exists(client, name) == "true"
    assert names[ds.idx["n"]]["bin"] == "n" and names[ds.idx["n"]]["type"] == "numeric"
    assert names[ds.idx["s"]]["type"] == "string" and names[ds.idx["b"]]["type"] == "blob"
    assert names[ds.idx["ln"]]["indextype"] == "list"
    assert names[ds.idx["mks"]]["indextype"] == "mapkeys"
    assert names[ds.idx["mvn"]]["indextype"] == "mapvalues"
    assert exists(client, "no_such_index_" + uid()) == "false"
    assert set_sindexes(client, ds.set) == len(ds.idx) == 12
    assert set_sindexes(client, ds.other_set) == 0
    # Entries: one per (distinct value, record).
    assert entries(client, ds.idx["n"]) == 24
    assert entries(client, ds.idx["s"]) == 24
    assert entries(client, ds.idx["ln"]) == 24 * 3
    assert entries(client, ds.idx["ls"]) == 24 + 1          # "e*" per record, and 25's "5"
    assert entries(client, ds.idx["mks"]) == 24 + 2         # 25: "k0" and "z"
    assert entries(client, ds.idx["mvs"]) == 24 + 1         # 25: "v0"
    assert entries(client, ds.idx["cv"]) == 24


# --------------------------------------------------------------------------
# Index lifecycle
# --------------------------------------------------------------------------

def test_index_built_over_existing_records(client, indexes, set_name):
    rows = {i: {"n": i, "l": [i % 10, i % 10, 100 + i % 3], "s": f"v{i % 7}"} for i in range(600)}
    batch_put(client, set_name, rows)
    n_idx, l_idx, s_idx = indexes.name("n"), indexes.name("l"), indexes.name("s")
    client.index_integer_create(NS, set_name, "n", n_idx)
    client.index_list_create(NS, set_name, "l", aerospike.INDEX_NUMERIC, l_idx)
    client.index_string_create(NS, set_name, "s", s_idx)
    assert index_stat(client, n_idx)["load_pct"] == "100"
    assert entries(client, n_idx) == 600
    assert entries(client, l_idx) == 600 * 2      # [x, x, y]: two distinct values
    assert entries(client, s_idx) == 600
    assert qkeys(client, set_name, p.between("n", 0, 599)) == list(range(600))
    assert qkeys(client, set_name, p.between("n", 100, 149)) == list(range(100, 150))
    assert qkeys(client, set_name, p.contains("l", aerospike.INDEX_TYPE_LIST, 3)) \
        == [i for i in range(600) if i % 10 == 3]
    assert qkeys(client, set_name, p.range("l", aerospike.INDEX_TYPE_LIST, 101, 102)) \
        == [i for i in range(600) if i % 3 != 0]
    assert qkeys(client, set_name, p.equals("s", "v4")) == [i for i in range(600) if i % 7 == 4]
    assert listing(client)[n_idx]["state"] == "RW"


def test_create_existing_name(client, indexes, set_name):
    client.put((NS, set_name, 1), {"a": 1, "b": "x"}, policy=KEY_SEND)
    name = indexes.name("dup")
    client.index_integer_create(NS, set_name, "a", name)
    # The same definition again: success, still one index.
    client.index_integer_create(NS, set_name, "a", name)
    assert info1(client, f"sindex/{NS}").count(f"indexname={name}:") == 1
    # Same name, another definition: 200.
    for create in (
        lambda: client.index_string_create(NS, set_name, "a", name),
        lambda: client.index_integer_create(NS, set_name, "b", name),
        lambda: client.index_integer_create(NS, set_name + "x", "a", name),
        lambda: client.index_list_create(NS, set_name, "a", aerospike.INDEX_NUMERIC, name),
    ):
        with pytest.raises(ex.IndexFoundError) as info:
            create()
        assert info.value.code == 200
    # The original index is untouched.
    fields = listing(client)[name]
    assert (fields["bin"], fields["type"], fields["indextype"], fields["set"]) == \
        ("a", "numeric", "default", set_name)
    assert qkeys(client, set_name, p.equals("a", 1)) == [1]


def test_create_same_definition_under_a_new_name_renames(client, indexes, set_name):
    client.put((NS, set_name, 1), {"a": 7}, policy=KEY_SEND)
    old, new = indexes.name("old"), indexes.name("new")
    client.index_integer_create(NS, set_name, "a", old)
    client.index_integer_create(NS, set_name, "a", new)
    assert exists(client, new) == "true"
    assert exists(client, old) == "false"
    assert qkeys(client, set_name, p.equals("a", 7)) == [1]


def test_geo2dsphere_queries(client, indexes, set_name):
    """The Go client's geo specs' data: points on a diagonal from
    (-122, 37.5), 0.1 degree a step, and one polygon record."""
    name = indexes.name("geo")
    client.index_geo2dsphere_create(NS, set_name, "loc", name)
    assert exists(client, name) == "true"
    assert listing(client)[name]["type"] == "geo2dsphere"
    bay = {"type": "Polygon",
           "coordinates": [[[-122.5, 37.0], [-121.0, 37.0], [-121.0, 38.08],
                            [-122.5, 38.08], [-122.5, 37.0]]]}
    for i in range(20):
        point = {"type": "Point", "coordinates": [-122.0 + 0.1 * i, 37.5 + 0.1 * i]}
        client.put((NS, set_name, i), {"loc": aerospike.GeoJSON(point)}, policy=KEY_SEND)
    client.put((NS, set_name, 100), {"loc": aerospike.GeoJSON(bay)}, policy=KEY_SEND)
    import json
    assert qkeys(client, set_name, p.geo_within_geojson_region("loc", json.dumps(bay))) == list(range(6))
    assert qkeys(client, set_name, p.geo_within_radius("loc", -122.0, 37.5, 50000.0)) == [0, 1, 2, 3]
    inside = json.dumps({"type": "Point", "coordinates": [-121.7, 37.8]})
    assert qkeys(client, set_name, p.geo_contains_geojson_point("loc", inside)) == [100]
    assert qkeys(client, set_name, p.geo_contains_point("loc", -120.0, 37.8)) == []
    # Records move out of the region and are deleted: the index follows.
    client.put((NS, set_name, 0), {"loc": aerospike.GeoJSON({"type": "Point", "coordinates": [10, 10]})},
               policy=KEY_SEND)
    client.remove((NS, set_name, 1))
    assert qkeys(client, set_name, p.geo_within_geojson_region("loc", json.dumps(bay))) == [2, 3, 4, 5]


def test_geo_regions_across_the_antimeridian(client, indexes, set_name):
    """A polygon around Fiji (178°E to 178°W) and points on both sides of
    the antimeridian: edges take the short way, as S2's great circles do,
    so the polygon holds the points near the line and none of the world
    the other way round."""
    import json
    name = indexes.name("fiji")
    client.index_geo2dsphere_create(NS, set_name, "loc", name)
    fiji = {"type": "Polygon",
            "coordinates": [[[178, -20], [-178, -20], [-178, -16], [178, -16], [178, -20]]]}
    points = {1: [179.5, -18], 2: [-179.5, -18], 3: [0, -18], 4: [-177, -18], 5: [177, -18]}
    for key, position in points.items():
        client.put((NS, set_name, key), {"loc": aerospike.GeoJSON({"type": "Point", "coordinates": position})},
                   policy=KEY_SEND)
    client.put((NS, set_name, 100), {"loc": aerospike.GeoJSON(fiji)}, policy=KEY_SEND)
    assert qkeys(client, set_name, p.geo_within_geojson_region("loc", json.dumps(fiji))) == [1, 2]
    for lng in (179.5, -179.5):
        assert qkeys(client, set_name, p.geo_contains_point("loc", lng, -18.0)) == [100]
    assert qkeys(client, set_name, p.geo_contains_point("loc", 0.0, -18.0)) == []


def test_index_remove(client, indexes, set_name):
    for i in range(5):
        client.put((NS, set_name, i), {"a": i, "t": f"s{i}"}, policy=KEY_SEND)
    name = indexes.name("rm")
    client.index_integer_create(NS, set_name, "a", name)
    assert set_sindexes(client, set_name) == 1
    assert qkeys(client, set_name, p.between("a", 1, 3)) == [1, 2, 3]
    client.index_remove(NS, name)
    assert exists(client, name) == "false"
    assert name not in listing(client)
    assert set_sindexes(client, set_name) == 0
    with pytest.raises(ex.IndexNotFound):
        run(client, set_name, p.between("a", 1, 3))
    # Removing it again (or any unknown index) is not an error.
    client.index_remove(NS, name)
    # The name is free for another definition, built over the records.
    client.index_single_value_create(NS, set_name, "t", aerospike.INDEX_STRING, name)
    assert qkeys(client, set_name, p.equals("t", "s4")) == [4]
    assert entries(client, name) == 5
    with pytest.raises(ex.IndexNotFound):
        run(client, set_name, p.between("a", 1, 3))


def test_index_on_a_set_created_before_its_records(client, indexes, set_name):
    name = indexes.name("early")
    client.index_integer_create(NS, set_name, "a", name)
    assert entries(client, name) == 0
    assert qkeys(client, set_name, p.between("a", 0, 100)) == []
    for i in range(6):
        client.put((NS, set_name, i), {"a": i * 10}, policy=KEY_SEND)
    client.put((NS, set_name + "o", 99), {"a": 20}, policy=KEY_SEND)  # another set
    assert qkeys(client, set_name, p.between("a", 15, 45)) == [2, 3, 4]
    assert entries(client, name) == 6


def test_whole_namespace_index(client, indexes, set_name):
    bin_name = "g" + uid(10)
    a, b = set_name, set_name + "b"
    for i in range(4):
        client.put((NS, a, i), {bin_name: i}, policy=KEY_SEND)
        client.put((NS, b, 10 + i), {bin_name: i}, policy=KEY_SEND)
    client.put((NS, None, 20), {bin_name: 1}, policy=KEY_SEND)  # no set
    name = indexes.name("ns")
    client.index_integer_create(NS, None, bin_name, name)
    assert listing(client)[name]["set"].upper() == "NULL"
    assert entries(client, name) == 9
    assert set_sindexes(client, a) == 0
    # Without a set: every set, and the records of no set.
    assert qkeys(client, None, p.between(bin_name, 1, 2)) == [1, 2, 11, 12, 20]
    # With a set: that set's records only (the namespace index is used).
    assert qkeys(client, a, p.between(bin_name, 1, 2)) == [1, 2]
    assert qkeys(client, b, p.equals(bin_name, 3)) == [13]
    # Writes after the build, in a set created after it.
    client.put((NS, set_name + "c", 30), {bin_name: 2}, policy=KEY_SEND)
    assert qkeys(client, None, p.equals(bin_name, 2)) == [2, 12, 30]
    assert qkeys(client, set_name + "c", p.equals(bin_name, 2)) == [30]
    # A set index and a namespace index on the same bin coexist.
    set_idx = indexes.name("nsset")
    client.index_integer_create(NS, a, bin_name, set_idx)
    assert entries(client, set_idx) == 4
    assert qkeys(client, a, p.between(bin_name, 0, 3)) == [0, 1, 2, 3]
    assert qkeys(client, None, p.between(bin_name, 0, 0)) == [0, 10]


def test_query_while_the_index_is_building(client, indexes, set_name):
    n = 4000
    big = list(range(200))
    batch_put(client, set_name, {i: {"l": big} for i in range(n)})
    name = indexes.name("slow")
    answer = info1(client, f"sindex-create:namespace={NS};set={set_name};indexname={name};"
                           f"indextype=LIST;bin=l;type=NUMERIC")
    assert answer == "ok"
    state = listing(client)[name]["state"]
    if state != "WO":
        pytest.skip("the build finished before the query could be sent")
    try:
        keys = qkeys(client, set_name, p.contains("l", aerospike.INDEX_TYPE_LIST, 7))
    except ex.IndexNotReadable:
        keys = None
    finally:
        for _ in range(300):
            if index_stat(client, name)["load_pct"] == "100":
                break
            time.sleep(0.1)
    assert keys is None, f"query during the build answered {len(keys)} of {n} records"
    assert len(qkeys(client, set_name, p.contains("l", aerospike.INDEX_TYPE_LIST, 7))) == n


@pytest.mark.parametrize("case", [
    pytest.param((exp.IntBin("a"), aerospike.INDEX_TYPE_DEFAULT, aerospike.INDEX_STRING),
                 id="integer-expression-string-index"),
    pytest.param((exp.IntBin("a"), aerospike.INDEX_TYPE_LIST, aerospike.INDEX_NUMERIC),
                 id="integer-expression-list-index"),
    pytest.param((exp.Add(1, 2), aerospike.INDEX_TYPE_DEFAULT, aerospike.INDEX_NUMERIC),
                 id="expression-without-bins"),
    pytest.param((exp.KeyInt(), aerospike.INDEX_TYPE_DEFAULT, aerospike.INDEX_NUMERIC),
                 id="expression-on-record-key"),
    pytest.param((exp.LastUpdateTime(), aerospike.INDEX_TYPE_DEFAULT, aerospike.INDEX_NUMERIC),
                 id="expression-on-metadata"),
])
def test_expression_index_definition_is_validated(client, indexes, set_name, case):
    expression, index_type, data_type = case
    name = indexes.name("badexp")
    with pytest.raises(ex.AerospikeError) as info:
        client.index_expr_create(NS, set_name, index_type, data_type, expression.compile(), name)
    assert info.value.code == 4
    assert exists(client, name) == "false"


# --------------------------------------------------------------------------
# Index maintenance on writes (module-scoped whole-namespace indexes on bin
# names nobody else uses; each test works in its own set)
# --------------------------------------------------------------------------

class NsIndexes:
    pass


@pytest.fixture(scope="module")
def w(client):
    tag = uid(6)
    made = Indexes(client)
    ix = NsIndexes()
    ix.n, ix.l, ix.s = "wn" + tag, "wl" + tag, "ws" + tag    # bins
    ix.expr = exp.Mul(exp.IntBin(ix.n), 10)
    try:
        ix.n_idx = made.name("wn")
        client.index_integer_create(NS, None, ix.n, ix.n_idx)
        ix.l_idx = made.name("wl")
        client.index_list_create(NS, None, ix.l, aerospike.INDEX_NUMERIC, ix.l_idx)
        ix.s_idx = made.name("ws")
        client.index_string_create(NS, None, ix.s, ix.s_idx)
        ix.e_idx = made.name("we")
        client.index_expr_create(NS, None, aerospike.INDEX_TYPE_DEFAULT, aerospike.INDEX_NUMERIC,
                                 ix.expr.compile(), ix.e_idx)
        yield ix
    finally:
        made.remove_all()


def _counts(client, w):
    return (entries(client, w.n_idx), entries(client, w.l_idx), entries(client, w.s_idx),
            entries(client, w.e_idx))


def _by_expr(client, set_name, w, lo_, hi):
    q = client.query(NS, set_name)
    q.where_with_expr(w.expr.compile(), p.between(None, lo_, hi))
    return ukeys(q.results())


def test_writes_keep_the_index_true(client, w, set_name):
    s = set_name
    n0, l0, s0, e0 = _counts(client, w)
    for i in range(5):
        client.put((NS, s, i), {w.n: i, w.l: [i, i, i + 50], w.s: f"v{i}"}, policy=KEY_SEND)
    assert _counts(client, w) == (n0 + 5, l0 + 10, s0 + 5, e0 + 5)
    assert qkeys(client, s, p.between(w.n, 0, 4)) == [0, 1, 2, 3, 4]

    # Update: the record leaves its old key and joins the new one.
    client.put((NS, s, 1), {w.n: 100}, policy=KEY_SEND)
    assert qkeys(client, s, p.equals(w.n, 1)) == []
    assert qkeys(client, s, p.equals(w.n, 100)) == [1]
    assert _by_expr(client, s, w, 1000, 1000) == [1]
    assert _by_expr(client, s, w, 10, 10) == []
    # A write of other bins leaves the entries alone.
    client.put((NS, s, 2), {"other": 1}, policy=KEY_SEND)
    client.touch((NS, s, 2))
    assert qkeys(client, s, p.equals(w.n, 2)) == [2]
    assert _counts(client, w) == (n0 + 5, l0 + 10, s0 + 5, e0 + 5)

    # List changes: elements in and out of range.
    client.put((NS, s, 3), {w.l: [7, 8]}, policy=KEY_SEND)
    assert qkeys(client, s, p.contains(w.l, aerospike.INDEX_TYPE_LIST, 3)) == []
    assert qkeys(client, s, p.contains(w.l, aerospike.INDEX_TYPE_LIST, 53)) == []
    assert qkeys(client, s, p.range(w.l, aerospike.INDEX_TYPE_LIST, 7, 8)) == [3]
    client.operate((NS, s, 3), [lo.list_append(w.l, 999)], policy=KEY_SEND)
    assert qkeys(client, s, p.contains(w.l, aerospike.INDEX_TYPE_LIST, 999)) == [3]
    assert entries(client, w.l_idx) == l0 + 11

    # Operate: increment moves the integer; a string replaced.
    client.operate((NS, s, 4), [op.increment(w.n, 1000), op.write(w.s, "changed")],
                   policy=KEY_SEND)
    assert qkeys(client, s, p.equals(w.n, 4)) == []
    assert qkeys(client, s, p.equals(w.n, 1004)) == [4]
    assert qkeys(client, s, p.equals(w.s, "v4")) == []
    assert qkeys(client, s, p.equals(w.s, "changed")) == [4]
    assert _by_expr(client, s, w, 10040, 10040) == [4]
    assert _counts(client, w) == (n0 + 5, l0 + 11, s0 + 5, e0 + 5)


def test_type_change_replace_and_remove_bin(client, w, set_name):
    s = set_name
    n0, l0, s0, e0 = _counts(client, w)
    for i in range(4):
        client.put((NS, s, i), {w.n: i, w.l: [i], w.s: "x"}, policy=KEY_SEND)
    # A value of another type leaves the index.
    client.put((NS, s, 0), {w.n: "zero", w.l: {"not": "a list"}, w.s: 0}, policy=KEY_SEND)
    assert qkeys(client, s, p.between(w.n, 0, 10)) == [1, 2, 3]
    assert qkeys(client, s, p.equals(w.s, "x")) == [1, 2, 3]
    assert qkeys(client, s, p.contains(w.l, aerospike.INDEX_TYPE_LIST, 0)) == []
    client.put((NS, s, 0), {w.n: 0}, policy=KEY_SEND)
    assert qkeys(client, s, p.between(w.n, 0, 10)) == [0, 1, 2, 3]
    # remove_bin
    client.remove_bin((NS, s, 1), [w.n, w.s], policy=KEY_SEND)
    assert qkeys(client, s, p.between(w.n, 0, 10)) == [0, 2, 3]
    assert qkeys(client, s, p.equals(w.s, "x")) == [2, 3]
    assert qkeys(client, s, p.contains(w.l, aerospike.INDEX_TYPE_LIST, 1)) == [1]
    assert _by_expr(client, s, w, 0, 100) == [0, 2, 3]
    # Replace: bins not written are gone.
    client.put((NS, s, 2), {"other": 1}, policy={"exists": aerospike.POLICY_EXISTS_REPLACE,
                                                "key": aerospike.POLICY_KEY_SEND})
    assert qkeys(client, s, p.between(w.n, 0, 10)) == [0, 3]
    assert qkeys(client, s, p.contains(w.l, aerospike.INDEX_TYPE_LIST, 2)) == []
    assert _counts(client, w) == (n0 + 2, l0 + 2, s0 + 1, e0 + 2)


def test_delete_removes_entries(client, w, set_name):
    s = set_name
    n0, l0, s0, e0 = _counts(client, w)
    for i in range(6):
        client.put((NS, s, i), {w.n: 7, w.l: [i, 100], w.s: "same"}, policy=KEY_SEND)
    assert qkeys(client, s, p.equals(w.n, 7)) == list(range(6))
    client.remove((NS, s, 2))
    client.remove((NS, s, 4), policy={"durable_delete": True})
    assert qkeys(client, s, p.equals(w.n, 7)) == [0, 1, 3, 5]
    assert qkeys(client, s, p.equals(w.s, "same")) == [0, 1, 3, 5]
    assert qkeys(client, s, p.contains(w.l, aerospike.INDEX_TYPE_LIST, 100)) == [0, 1, 3, 5]
    assert _by_expr(client, s, w, 70, 70) == [0, 1, 3, 5]
    assert _counts(client, w) == (n0 + 4, l0 + 8, s0 + 4, e0 + 4)
    # Written again: back in the index, once.
    client.put((NS, s, 2), {w.n: 7}, policy=KEY_SEND)
    assert qkeys(client, s, p.equals(w.n, 7)) == [0, 1, 2, 3, 5]
    assert entries(client, w.n_idx) == n0 + 5


def test_truncate_removes_entries(client, w, set_name):
    s, other = set_name, set_name + "k"
    n0, l0, s0, e0 = _counts(client, w)
    for i in range(8):
        client.put((NS, s, i), {w.n: i, w.l: [i, i + 1], w.s: "t"}, policy=KEY_SEND)
    client.put((NS, other, 50), {w.n: 3}, policy=KEY_SEND)
    assert _counts(client, w) == (n0 + 9, l0 + 16, s0 + 8, e0 + 9)
    time.sleep(0.05)  # the truncation time must be past the records' last update
    client.truncate(NS, s, 0)
    time.sleep(0.05)
    assert qkeys(client, s, p.between(w.n, 0, 100)) == []
    assert qkeys(client, s, p.range(w.l, aerospike.INDEX_TYPE_LIST, 0, 100)) == []
    assert qkeys(client, s, p.equals(w.s, "t")) == []
    assert qkeys(client, other, p.equals(w.n, 3)) == [50]  # another set: untouched
    assert _counts(client, w) == (n0 + 1, l0, s0, e0 + 1)
    # Records written after the truncation are indexed.
    client.put((NS, s, 100), {w.n: 5, w.s: "t"}, policy=KEY_SEND)
    assert qkeys(client, s, p.between(w.n, 0, 100)) == [100]
    assert qkeys(client, s, p.equals(w.s, "t")) == [100]


def test_truncate_with_a_last_update_time(client, w, set_name):
    s = set_name
    for i in range(3):
        client.put((NS, s, i), {w.n: i}, policy=KEY_SEND)
    time.sleep(0.05)
    cut = time.time_ns()
    time.sleep(0.05)
    for i in range(3, 6):
        client.put((NS, s, i), {w.n: i}, policy=KEY_SEND)
    client.truncate(NS, s, cut)
    time.sleep(0.05)
    assert qkeys(client, s, p.between(w.n, 0, 10)) == [3, 4, 5]


def test_expired_records_are_not_returned(client, w, set_name):
    s = set_name
    for i in range(3):
        client.put((NS, s, i), {w.n: 1, w.l: [1], w.s: "ttl"}, meta={"ttl": 1}, policy=KEY_SEND)
    client.put((NS, s, 9), {w.n: 1, w.l: [1], w.s: "ttl"}, policy=KEY_SEND)
    assert qkeys(client, s, p.equals(w.n, 1)) == [0, 1, 2, 9]
    time.sleep(2.5)
    assert qkeys(client, s, p.equals(w.n, 1)) == [9]
    assert qkeys(client, s, p.contains(w.l, aerospike.INDEX_TYPE_LIST, 1)) == [9]
    assert qkeys(client, s, p.equals(w.s, "ttl")) == [9]
    assert _by_expr(client, s, w, 10, 10) == [9]


def test_large_results_span_several_chunks(client, w, set_name):
    s = set_name
    for i in range(30):
        client.put((NS, s, i), {w.n: i, "big": "x" * 100_000}, policy=KEY_SEND)
    records = run(client, s, p.between(w.n, 0, 29))
    assert ukeys(records) == list(range(30))
    assert all(len(r[2]["big"]) == 100_000 for r in records)
    pages = _paginate(_q(client, s, p.between(w.n, 0, 29)), 8)
    keys = [r[0][2] for page in pages for r in page]
    assert sorted(keys) == list(range(30)) and len(keys) == 30


def _q(client, set_name, predicate):
    q = client.query(NS, set_name)
    q.where(predicate)
    return q


def test_query_over_many_index_entries(client, w, set_name):
    """A range that matches ~100 entries per record (more entries than one
    step of the server examines): every record once, also across pages."""
    s = set_name
    n = 800
    batch_put(client, s, {i: {w.l: list(range(100)), w.n: 7} for i in range(n)})
    keys = qkeys(client, s, p.range(w.l, aerospike.INDEX_TYPE_LIST, 0, 99))
    assert keys == list(range(n))
    pages = _paginate(_q(client, s, p.equals(w.n, 7)), 150)
    keys = [r[0][2] for page in pages for r in page]
    assert sorted(keys) == list(range(n)) and len(keys) == n


def test_query_on_a_set_that_does_not_exist(client, w):
    # With a namespace index on the bin: an empty answer. Without any index on
    # the bin: no index (the index is looked up before the set).
    assert qkeys(client, "nosuchset" + uid(), p.between(w.n, -2**63, 2**63 - 1)) == []
    with pytest.raises(ex.IndexNotFound):
        run(client, "nosuchset" + uid(), p.between("nobin" + uid(), 0, 4))


def wait_for_job(client, job):
    """Polls job_info (query-show) until the background job is done."""
    for _ in range(100):
        if client.job_info(job, aerospike.JOB_QUERY)["status"] == aerospike.JOB_STATUS_COMPLETED:
            return
        time.sleep(0.1)
    pytest.fail("background job did not complete")


def test_background_query_writes_only_matching_records(client, w, set_name):
    """A background query (ops, no read) writes exactly the records its
    predicate selects, in its set; job_info follows it to completion."""
    s = set_name
    for i in range(6):
        client.put((NS, s, i), {w.n: i}, policy=KEY_SEND)
    client.put((NS, s + "o", 2), {w.n: 2}, policy=KEY_SEND)  # another set
    q = client.query(NS, s)
    q.where(p.between(w.n, 1, 3))
    q.add_ops([op.write("touched", 1)])
    job = q.execute_background()
    wait_for_job(client, job)
    info = client.job_info(job, aerospike.JOB_QUERY)
    assert info["records_read"] == 3, info
    touched = {i for i in range(6) if "touched" in client.get((NS, s, i))[2]}
    assert touched == {1, 2, 3}
    assert "touched" not in client.get((NS, s + "o", 2))[2]
    for i in range(6):
        assert client.get((NS, s, i))[2][w.n] == i


def test_background_scan_writes_every_record_of_its_set(client, w, set_name):
    """A background scan (no predicate) writes every record of its set. (A
    read op is refused by the C client itself before it reaches the server;
    the service tests send one: 4.)"""
    s = set_name
    for i in range(5):
        client.put((NS, s, i), {w.n: i}, policy=KEY_SEND)
    q = client.query(NS, s)
    q.add_ops([op.increment(w.n, 100)])
    job = q.execute_background()
    wait_for_job(client, job)
    assert sorted(client.get((NS, s, i))[2][w.n] for i in range(5)) == [100, 101, 102, 103, 104]



def test_a_set_index_lists_its_set_and_a_scan_reads_it(client):
    """Set indexes (servers 8.1.2+: `sindex-create ... indextype=SET`, as the
    official C client sends it): built over the set's records, kept true by
    later writes and deletes, listed and dropped like other indexes; a scan of
    the set then reads the index and answers exactly what it answered without
    it, paged scans included; a filter query does not take it for a bin index."""
    set_name = f"si-{uid()}"
    other = f"si-{uid()}"
    for i in range(50):
        client.put((NS, set_name, i), {"a": i}, policy=KEY_SEND)
        client.put((NS, other, i), {"a": i}, policy=KEY_SEND)

    def scanned():
        return ukeys(client.query(NS, set_name).results())

    assert scanned() == list(range(50))
    name = f"set-{uid()}"
    assert info1(client, f"sindex-create:namespace={NS};set={set_name};indexname={name};indextype=SET") == "ok"
    for _ in range(300):
        if index_stat(client, name)["load_pct"] == "100":
            break
        time.sleep(0.1)
    try:
        assert entries(client, name) == 50
        fields = listing(client)[name]
        # The reference lists a set index's set alone: no bin, type or state.
        assert (fields["set"], fields["indextype"]) == (set_name, "set")
        assert "bin" not in fields and "state" not in fields, fields
        # Later writes and deletes keep it true; the other set stays out.
        client.put((NS, set_name, 50), {"a": 50}, policy=KEY_SEND)
        client.remove((NS, set_name, 0))
        client.put((NS, other, 99), {"a": 99}, policy=KEY_SEND)
        assert entries(client, name) == 50
        assert scanned() == list(range(1, 51))
        # The scan read its records from the index.
        assert int(index_stat(client, name)["query_basic_records"]) == 50
        # Paged scans resume at the last digest, as without the index.
        pages = _paginate(client.query(NS, set_name), 7)
        assert sorted(k for page in pages for k in ukeys(page)) == list(range(1, 51))
        assert max(len(page) for page in pages) == 7
        # A filter finds no bin index in it.
        with pytest.raises(ex.AerospikeError) as error:
            client.query(NS, set_name).where(p.between("a", 0, 10)).results()
        assert error.value.code == 201
    finally:
        assert info1(client, f"sindex-delete:namespace={NS};indexname={name}") == "ok"
    assert name not in listing(client)
    assert scanned() == list(range(1, 51))
