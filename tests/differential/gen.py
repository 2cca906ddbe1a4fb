"""The generator: a seed's sequence of steps.

`sequence(seed, length)` is a pure function of its arguments (one
`random.Random(seed)`; no clock, no server): the same seed gives the same
steps on every machine, so a seed names a test case. Steps work on three
records (`KEYS`) so that writes, reads, deletes and batches collide on the
same records, and mostly on bins typed by name (`i` integers, `f` floats,
`s` strings, `b` blobs for bit ops, `l` lists, `m` maps, `h` HLLs, `g`
GeoJSON, `x` anything), with a share of ops aimed at a bin of another type
or a missing one, where the error answers live.

Timing stays out of every answer the tester compares: TTLs are never short
enough to expire during a run, read-touch percentages never reach the
remaining TTL, no expression reads the clock or a record's size."""

import random

from steps import Call, Sym, compiled

NS = "test"
KEYS = [1, 2, "k"]
ABSENT_KEY = 99  # never written: batches and reads of a record that is not there
BINS = ["i", "f", "s", "b", "l", "m", "h", "g", "x"]

INTS = [0, 1, -1, 2, 3, 7, 100, -100, 255, 2**31, 2**63 - 1, -2**63]
FLOATS = [0.0, 1.5, -2.25, 0.1, 1e10, 3.0]
STRS = ["", "a", "b", "abc", "zz", "h\u00e9llo", "A" * 40]
BLOBS = [b"", b"\x00", b"\x01\x02", b"\xff\xff\xff\xff", bytes(range(8))]
ELEMS = [-1, 0, 1, 2, 3, 5, "a", "b", "c"]  # list items and map keys: collide on purpose
MAP_KEYS = [1, 2, 3, "a", "b", "c"]
# TTLs of writes: namespace default, never expire, do not change, and long
# enough never to expire (nor to be read-touched) during a run.
TTLS = [0, -1, -2, 3000, 864000]
# Durable deletes are an Enterprise feature: the reference (Community
# Edition) refuses every one with 25, while Citrine has them (README: device
# storage). Steps ask only for durable_delete=False: the answers to True
# could only differ.


def sym(name):
    return Sym("aerospike." + name)


def sequence(seed, length):
    """The steps of seed `seed`: `length` client calls."""
    gen = Generator(random.Random(seed))
    return [gen.step() for _ in range(length)]


class Values:
    """Random values of every particle type."""

    def __init__(self, rng):
        self.rng = rng

    def pick(self, seq):
        return self.rng.choice(seq)

    def chance(self, p):
        return self.rng.random() < p

    def scalar(self):
        kind = self.rng.choices(["int", "float", "str", "blob", "bool"], [5, 2, 4, 2, 1])[0]
        return {"int": lambda: self.pick(INTS), "float": lambda: self.pick(FLOATS),
                "str": lambda: self.pick(STRS), "blob": lambda: self.pick(BLOBS),
                "bool": lambda: self.chance(0.5)}[kind]()

    def elem(self, depth=1):
        """A list item or map value: mostly small colliding scalars."""
        if depth < 3 and self.chance(0.15):
            return self.list_value(depth + 1) if self.chance(0.5) else self.map_value(depth + 1)
        if self.chance(0.75):
            return self.pick(ELEMS)
        return self.scalar()

    def list_value(self, depth=1):
        return [self.elem(depth) for _ in range(self.rng.randint(0, 5))]

    def map_value(self, depth=1):
        keys = self.rng.sample(MAP_KEYS, self.rng.randint(0, 4))
        return {k: self.elem(depth) for k in keys}

    def geo(self):
        x, y = self.pick([0.0, 1.5, -122.5, 45.25]), self.pick([0.0, 2.5, 37.75])
        shape = self.rng.choice([
            {"type": "Point", "coordinates": [x, y]},
            {"type": "Polygon", "coordinates": [[[0.0, 0.0], [0.0, 3.0], [3.0, 3.0],
                                                 [3.0, 0.0], [0.0, 0.0]]]},
            {"type": "AeroCircle", "coordinates": [[x, y], 1000.0]},
        ])
        return Call("aerospike.GeoJSON", shape)

    def any_value(self):
        kind = self.rng.choices(["scalar", "list", "map", "geo"], [6, 2, 2, 1])[0]
        return {"scalar": self.scalar, "list": self.list_value, "map": self.map_value,
                "geo": self.geo}[kind]()

    def bin_value(self, name):
        """A value for bin `name`, mostly of the type its name stands for."""
        if self.chance(0.1):
            return self.any_value()
        return {"i": lambda: self.pick(INTS), "f": lambda: self.pick(FLOATS),
                "s": lambda: self.pick(STRS), "b": lambda: self.pick(BLOBS),
                "l": self.list_value, "m": self.map_value, "g": self.geo,
                "h": lambda: self.pick(BLOBS), "x": self.any_value}[name]()

    def bin_for(self, typed):
        """Usually the bin `typed`; sometimes another one (wrong type or missing)."""
        return typed if self.chance(0.8) else self.pick(BINS)


class Policies(Values):
    """Policies and record metadata."""

    def key(self, absent_ok=False):
        keys = KEYS + [ABSENT_KEY] if absent_ok and self.chance(0.2) else KEYS
        return (NS, Sym("SET"), self.pick(keys))

    def ttl(self):
        return self.pick(TTLS)

    def write_policy(self, filters):
        policy = {}
        if self.chance(0.3):
            policy["exists"] = sym(self.pick(["POLICY_EXISTS_IGNORE", "POLICY_EXISTS_CREATE",
                                              "POLICY_EXISTS_UPDATE", "POLICY_EXISTS_REPLACE",
                                              "POLICY_EXISTS_CREATE_OR_REPLACE"]))
        if self.chance(0.2):
            policy["gen"] = sym(self.pick(["POLICY_GEN_EQ", "POLICY_GEN_GT"]))
        if self.chance(0.3):
            policy["key"] = sym(self.pick(["POLICY_KEY_SEND", "POLICY_KEY_DIGEST"]))
        if self.chance(0.1):
            policy["durable_delete"] = False  # never True: see TTLS
        if self.chance(0.3):
            policy["ttl"] = self.ttl()
        if self.chance(0.1):
            policy["expressions"] = compiled(filters.boolean())
        return policy or None

    def read_policy(self, filters):
        policy = {}
        if self.chance(0.2):
            policy["key"] = sym(self.pick(["POLICY_KEY_SEND", "POLICY_KEY_DIGEST"]))
        if self.chance(0.1):
            # Never high enough to touch a record during a run (TTLS).
            policy["read_touch_ttl_percent"] = self.pick([-1, 0, 50, 80])
        if self.chance(0.1):
            policy["expressions"] = compiled(filters.boolean())
        return policy or None

    def meta(self, policy):
        """Record metadata: the generation a gen policy compares with."""
        if policy and "gen" in policy:
            return {"gen": self.rng.randint(0, 4)}
        return None

    def bins(self):
        names = self.rng.sample(BINS, self.rng.randint(1, 3))
        return {n: (None if self.chance(0.05) else self.bin_value(n)) for n in names}

    def bin_names(self, allow_empty=False):
        low = 0 if allow_empty and self.chance(0.1) else 1
        return self.rng.sample(BINS, self.rng.randint(low, 3))


class Exprs(Values):
    """Typed expressions (no clock, no record size: their answers must not
    depend on timing or on a storage format)."""

    def expr(self, kind, depth=0):
        leaf = depth >= 2 or self.chance(0.35)
        table = getattr(self, f"_{kind}_leaf" if leaf else f"_{kind}_node")
        return table(depth + 1)

    def boolean(self):
        return self.expr("bool")

    def _int_leaf(self, d):
        return self.rng.choice([
            lambda: self.pick(INTS[:9]),
            lambda: Call("exp.IntBin", self.bin_for("i")),
            lambda: Call("exp.ListSize", None, Call("exp.ListBin", self.bin_for("l"))),
            lambda: Call("exp.MapSize", None, Call("exp.MapBin", self.bin_for("m"))),
            lambda: Call("exp.BinType", self.pick(BINS)),
            lambda: Call("exp.DigestMod", self.pick([1, 2, 3])),
            lambda: Call("exp.HLLGetCount", Call("exp.HLLBin", self.bin_for("h"))),
            lambda: Call("exp.BitCount", self.pick([0, 3]), self.pick([8, 16]),
                         Call("exp.BlobBin", self.bin_for("b"))),
            lambda: Call("exp.BitGetInt", 0, self.pick([4, 8]), self.chance(0.5),
                         Call("exp.BlobBin", self.bin_for("b"))),
        ])()

    def _int_node(self, d):
        a, b = self.expr("int", d), self.expr("int", d)
        return self.rng.choice([
            lambda: Call("exp.Add", a, b), lambda: Call("exp.Sub", a, b),
            lambda: Call("exp.Mul", a, b), lambda: Call("exp.Div", a, b),
            lambda: Call("exp.Mod", a, b), lambda: Call("exp.Abs", a),
            lambda: Call("exp.Min", a, b), lambda: Call("exp.Max", a, b),
            lambda: Call("exp.IntAnd", a, b), lambda: Call("exp.IntXOr", a, b),
            lambda: Call("exp.IntNot", a), lambda: Call("exp.IntCount", a),
            lambda: Call("exp.IntLeftShift", a, self.pick([0, 1, 3])),
            lambda: Call("exp.ToInt", self.expr("float", d)),
            lambda: Call("exp.Cond", self.expr("bool", d), a, b),
            lambda: Call("exp.Let", Call("exp.Def", "v", a),
                         Call("exp.Add", Call("exp.Var", "v"), b)),
            lambda: Call("exp.ListGetByIndex", None, sym("LIST_RETURN_VALUE"),
                         Sym("exp.ResultType.INTEGER"), self.pick([0, 1, -1]),
                         Call("exp.ListBin", self.bin_for("l"))),
            lambda: Call("exp.MapGetByKey", None, sym("MAP_RETURN_VALUE"),
                         Sym("exp.ResultType.INTEGER"), self.pick(MAP_KEYS),
                         Call("exp.MapBin", self.bin_for("m"))),
            lambda: Call("exp.ListGetByValue", None, sym("LIST_RETURN_COUNT"),
                         self.pick(ELEMS), Call("exp.ListBin", self.bin_for("l"))),
        ])()

    def _float_leaf(self, d):
        return self.rng.choice([lambda: self.pick(FLOATS),
                                lambda: Call("exp.FloatBin", self.bin_for("f"))])()

    def _float_node(self, d):
        a, b = self.expr("float", d), self.expr("float", d)
        return self.rng.choice([
            lambda: Call("exp.Add", a, b), lambda: Call("exp.Mul", a, b),
            lambda: Call("exp.Div", a, b), lambda: Call("exp.Abs", a),
            lambda: Call("exp.Floor", a), lambda: Call("exp.Ceil", a),
            lambda: Call("exp.Pow", a, b), lambda: Call("exp.Log", a, b),
            lambda: Call("exp.ToFloat", self.expr("int", d)),
        ])()

    def _str_leaf(self, d):
        return self.rng.choice([lambda: self.pick(STRS),
                                lambda: Call("exp.StrBin", self.bin_for("s")),
                                lambda: Call("exp.SetName")])()

    _str_node = _str_leaf

    def _bool_leaf(self, d):
        return self.rng.choice([
            lambda: self.chance(0.5),
            lambda: Call("exp.BinExists", self.pick(BINS)),
            lambda: Call("exp.KeyExists"),
            lambda: Call("exp.IsTombstone"),
            lambda: Call("exp.CmpRegex", 0, self.pick(["^a", "b", ".*", "l+o$"]),
                         Call("exp.StrBin", self.bin_for("s"))),
            lambda: Call("exp.CmpGeo", Call("exp.GeoBin", self.bin_for("g")), self.geo()),
        ])()

    def _bool_node(self, d):
        kind = self.pick(["int", "int", "float", "str"])
        a, b = self.expr(kind, d), self.expr(kind, d)
        cmp = self.pick(["Eq", "NE", "GT", "GE", "LT", "LE"])
        return self.rng.choice([
            lambda: Call("exp." + cmp, a, b),
            lambda: Call("exp.And", self.expr("bool", d), self.expr("bool", d)),
            lambda: Call("exp.Or", self.expr("bool", d), self.expr("bool", d)),
            lambda: Call("exp.Not", self.expr("bool", d)),
            lambda: Call("exp.Exclusive", self.expr("bool", d), self.expr("bool", d)),
        ])()

    def _list_leaf(self, d):
        return Call("exp.ListBin", self.bin_for("l"))

    def _list_node(self, d):
        target = self.expr("list", d)
        return self.rng.choice([
            lambda: Call("exp.ListAppend", None, None, self.elem(), target),
            lambda: Call("exp.ListInsert", None, None, self.pick([0, 1, 5]), self.elem(), target),
            lambda: Call("exp.ListSort", None, 0, target),
            lambda: Call("exp.ListRemoveByValue", None, self.pick(ELEMS), target),
            lambda: Call("exp.ListGetByIndexRange", None, sym("LIST_RETURN_VALUE"),
                         self.pick([0, 1, -2]), self.pick([1, 2, 5]), target),
        ])()

    def _map_leaf(self, d):
        return Call("exp.MapBin", self.bin_for("m"))

    def _map_node(self, d):
        target = self.expr("map", d)
        return self.rng.choice([
            lambda: Call("exp.MapPut", None, None, self.pick(MAP_KEYS), self.elem(), target),
            lambda: Call("exp.MapRemoveByKey", None, self.pick(MAP_KEYS), target),
            lambda: Call("exp.MapIncrement", None, None, self.pick(MAP_KEYS), 1, target),
        ])()

    def _blob_leaf(self, d):
        return self.rng.choice([lambda: self.pick(BLOBS),
                                lambda: Call("exp.BlobBin", self.bin_for("b"))])()

    def _blob_node(self, d):
        target = Call("exp.BlobBin", self.bin_for("b"))
        return self.rng.choice([
            lambda: Call("exp.BitSet", None, self.pick([0, 4]), 8, b"\xaa", target),
            lambda: Call("exp.BitResize", None, self.pick([0, 2, 6]), 0, target),
            lambda: Call("exp.BitInsert", None, self.pick([0, 1]), b"\x0f", target),
        ])()


class Ops(Exprs):
    """Operations of an operate: basic, list, map, bit, HLL, expression."""

    def op(self):
        family = self.rng.choices(["basic", "list", "map", "bit", "hll", "exp"],
                                  [5, 6, 6, 3, 2, 3])[0]
        return getattr(self, f"{family}_op")()

    def basic_op(self):
        name = self.pick(["i", "f", "s", "l", "m", "x"])
        return self.rng.choice([
            lambda: Call("operations.write", name, self.bin_value(name)),
            lambda: Call("operations.read", self.pick(BINS)),
            lambda: Call("operations.increment", self.bin_for(self.pick(["i", "f"])),
                         self.pick([1, -3, 0.5, 2**63 - 1])),
            lambda: Call("operations.append", self.bin_for("s"),
                         self.pick(STRS) if self.chance(0.8) else self.scalar()),
            lambda: Call("operations.prepend", self.bin_for("s"),
                         self.pick(STRS) if self.chance(0.8) else self.scalar()),
            lambda: Call("operations.touch", self.pick([None, 3000, -1])),
            lambda: Call("operations.delete"),
        ])()

    def ctx(self):
        """Sometimes a context path into the list or map bin."""
        if not self.chance(0.15):
            return None
        step = self.rng.choice([
            lambda: Call("cdt_ctx.cdt_ctx_list_index", self.pick([0, 1, -1, 4])),
            lambda: Call("cdt_ctx.cdt_ctx_list_rank", self.pick([0, -1])),
            lambda: Call("cdt_ctx.cdt_ctx_list_value", self.elem()),
            lambda: Call("cdt_ctx.cdt_ctx_list_index_create", self.pick([0, 2]),
                         sym(self.pick(["LIST_UNORDERED", "LIST_ORDERED"])), self.chance(0.5)),
            lambda: Call("cdt_ctx.cdt_ctx_map_key", self.pick(MAP_KEYS)),
            lambda: Call("cdt_ctx.cdt_ctx_map_index", self.pick([0, -1, 3])),
            lambda: Call("cdt_ctx.cdt_ctx_map_rank", self.pick([0, 1])),
            lambda: Call("cdt_ctx.cdt_ctx_map_value", self.elem()),
            lambda: Call("cdt_ctx.cdt_ctx_map_key_create", self.pick(MAP_KEYS),
                         sym(self.pick(["MAP_UNORDERED", "MAP_KEY_ORDERED"]))),
        ])()
        return [step]

    def list_rt(self):
        return sym("LIST_RETURN_" + self.pick(["NONE", "INDEX", "REVERSE_INDEX", "RANK",
                                               "REVERSE_RANK", "COUNT", "VALUE", "EXISTS"]))

    def list_policy(self):
        if not self.chance(0.3):
            return None
        flags = self.rng.sample(["LIST_WRITE_ADD_UNIQUE", "LIST_WRITE_INSERT_BOUNDED",
                                 "LIST_WRITE_NO_FAIL", "LIST_WRITE_PARTIAL"],
                                self.rng.randint(0, 2))
        policy = {"write_flags": Sym(" | ".join("aerospike." + f for f in flags) or
                                     "aerospike.LIST_WRITE_DEFAULT")}
        if self.chance(0.5):
            policy["list_order"] = sym(self.pick(["LIST_UNORDERED", "LIST_ORDERED"]))
        return policy

    def list_op(self):
        b, idx, rt = self.bin_for("l"), self.pick([0, 1, 2, -1, -3, 7]), self.list_rt()
        cnt, inv = self.pick([0, 1, 2, 5]), self.chance(0.3)
        ctx, pol = self.ctx(), self.list_policy()
        v, vals = self.elem(), [self.elem() for _ in range(self.rng.randint(0, 3))]
        lo, hi = sorted(self.rng.sample([-1, 0, 1, 2, 3, 5], 2))
        L = "list_operations."
        return self.rng.choice([
            lambda: Call(L + "list_append", b, v, policy=pol, ctx=ctx),
            lambda: Call(L + "list_append_items", b, vals, policy=pol, ctx=ctx),
            lambda: Call(L + "list_insert", b, idx, v, policy=pol, ctx=ctx),
            lambda: Call(L + "list_insert_items", b, idx, vals, policy=pol, ctx=ctx),
            lambda: Call(L + "list_increment", b, idx, self.pick([1, -2, 1.5]), policy=pol,
                         ctx=ctx),
            lambda: Call(L + "list_set", b, idx, v, policy=pol, ctx=ctx),
            lambda: Call(L + "list_pop", b, idx, ctx=ctx),
            lambda: Call(L + "list_pop_range", b, idx, cnt, ctx=ctx),
            lambda: Call(L + "list_remove", b, idx, ctx=ctx),
            lambda: Call(L + "list_remove_range", b, idx, cnt, ctx=ctx),
            lambda: Call(L + "list_trim", b, idx, cnt, ctx=ctx),
            lambda: Call(L + "list_clear", b, ctx=ctx),
            lambda: Call(L + "list_size", b, ctx=ctx),
            lambda: Call(L + "list_get", b, idx, ctx=ctx),
            lambda: Call(L + "list_get_range", b, idx, cnt, ctx=ctx),
            lambda: Call(L + "list_sort", b, self.pick([0, 2]), ctx=ctx),
            lambda: Call(L + "list_set_order", b,
                         sym(self.pick(["LIST_UNORDERED", "LIST_ORDERED"])), ctx=ctx),
            lambda: Call(L + "list_get_by_index", b, idx, rt, ctx=ctx),
            lambda: Call(L + "list_get_by_index_range", b, idx, rt, count=cnt, inverted=inv,
                         ctx=ctx),
            lambda: Call(L + "list_get_by_rank", b, idx, rt, ctx=ctx),
            lambda: Call(L + "list_get_by_rank_range", b, idx, rt, count=cnt, inverted=inv,
                         ctx=ctx),
            lambda: Call(L + "list_get_by_value", b, v, rt, inverted=inv, ctx=ctx),
            lambda: Call(L + "list_get_by_value_list", b, vals, rt, inverted=inv, ctx=ctx),
            lambda: Call(L + "list_get_by_value_range", b, rt, lo, hi, inverted=inv, ctx=ctx),
            lambda: Call(L + "list_get_by_value_rank_range_relative", b, v, idx, rt, count=cnt,
                         inverted=inv, ctx=ctx),
            lambda: Call(L + "list_remove_by_index", b, idx, rt, ctx=ctx),
            lambda: Call(L + "list_remove_by_index_range", b, idx, rt, count=cnt, inverted=inv,
                         ctx=ctx),
            lambda: Call(L + "list_remove_by_rank", b, idx, rt, ctx=ctx),
            lambda: Call(L + "list_remove_by_rank_range", b, idx, rt, count=cnt, inverted=inv,
                         ctx=ctx),
            lambda: Call(L + "list_remove_by_value", b, v, rt, inverted=inv, ctx=ctx),
            lambda: Call(L + "list_remove_by_value_list", b, vals, rt, inverted=inv, ctx=ctx),
            lambda: Call(L + "list_remove_by_value_range", b, rt, lo, hi, inverted=inv, ctx=ctx),
            lambda: Call(L + "list_remove_by_value_rank_range_relative", b, v, idx, rt, count=cnt,
                         inverted=inv, ctx=ctx),
        ])()

    def map_rt(self):
        return sym("MAP_RETURN_" + self.pick(["NONE", "INDEX", "REVERSE_INDEX", "RANK",
                                              "REVERSE_RANK", "COUNT", "KEY", "VALUE",
                                              "KEY_VALUE", "EXISTS", "UNORDERED_MAP",
                                              "ORDERED_MAP"]))

    def map_policy(self):
        if not self.chance(0.3):
            return None
        flags = self.rng.sample(["MAP_WRITE_FLAGS_CREATE_ONLY", "MAP_WRITE_FLAGS_UPDATE_ONLY",
                                 "MAP_WRITE_FLAGS_NO_FAIL", "MAP_WRITE_FLAGS_PARTIAL"],
                                self.rng.randint(0, 2))
        policy = {"map_write_flags": Sym(" | ".join("aerospike." + f for f in flags) or
                                         "aerospike.MAP_WRITE_FLAGS_DEFAULT")}
        if self.chance(0.5):
            policy["map_order"] = sym(self.pick(["MAP_UNORDERED", "MAP_KEY_ORDERED",
                                                 "MAP_KEY_VALUE_ORDERED"]))
        return policy

    def map_op(self):
        # Never an inverted selection by an empty key or value list: the
        # reference (8.1.2) crashes on one (SIGSEGV in
        # map_offset_index_check_and_fill), which compares nothing.
        b, k, rt, ctx = self.bin_for("m"), self.pick(MAP_KEYS), self.map_rt(), self.ctx()
        idx, cnt = self.pick([0, 1, -1, 3]), self.pick([0, 1, 2, 5])
        inv, pol = self.chance(0.3), self.map_policy()
        keys = self.rng.sample(MAP_KEYS, self.rng.randint(0, 3))
        lo, hi = sorted(self.rng.sample([0, 1, 2, 3, 5], 2))
        v, vals = self.elem(), [self.elem() for _ in range(self.rng.randint(0, 3))]
        M = "map_operations."
        return self.rng.choice([
            lambda: Call(M + "map_put", b, k, v, map_policy=pol, ctx=ctx),
            lambda: Call(M + "map_put_items", b, self.map_value(), map_policy=pol, ctx=ctx),
            lambda: Call(M + "map_increment", b, k, self.pick([1, -2, 0.5]), map_policy=pol,
                         ctx=ctx),
            lambda: Call(M + "map_decrement", b, k, self.pick([1, 3]), map_policy=pol, ctx=ctx),
            lambda: Call(M + "map_set_policy", b, self.map_policy() or
                         {"map_order": sym("MAP_KEY_ORDERED")}, ctx=ctx),
            lambda: Call(M + "map_clear", b, ctx=ctx),
            lambda: Call(M + "map_size", b, ctx=ctx),
            lambda: Call(M + "map_get_by_key", b, k, rt, ctx=ctx),
            lambda: Call(M + "map_get_by_key_list", b, keys, rt, inverted=inv and bool(keys),
                         ctx=ctx),
            lambda: Call(M + "map_get_by_key_range", b, lo, hi, rt, inverted=inv, ctx=ctx),
            lambda: Call(M + "map_get_by_key_index_range_relative", b, k, idx, rt, count=cnt,
                         inverted=inv, ctx=ctx),
            lambda: Call(M + "map_get_by_index", b, idx, rt, ctx=ctx),
            lambda: Call(M + "map_get_by_index_range", b, idx, cnt, rt, inverted=inv, ctx=ctx),
            lambda: Call(M + "map_get_by_rank", b, idx, rt, ctx=ctx),
            lambda: Call(M + "map_get_by_rank_range", b, idx, cnt, rt, inverted=inv, ctx=ctx),
            lambda: Call(M + "map_get_by_value", b, v, rt, inverted=inv, ctx=ctx),
            lambda: Call(M + "map_get_by_value_list", b, vals, rt, inverted=inv and bool(vals),
                         ctx=ctx),
            lambda: Call(M + "map_get_by_value_range", b, lo, hi, rt, inverted=inv, ctx=ctx),
            lambda: Call(M + "map_get_by_value_rank_range_relative", b, v, idx, rt, count=cnt,
                         inverted=inv, ctx=ctx),
            lambda: Call(M + "map_remove_by_key", b, k, rt, ctx=ctx),
            lambda: Call(M + "map_remove_by_key_list", b, keys, rt, inverted=inv and bool(keys),
                         ctx=ctx),
            lambda: Call(M + "map_remove_by_key_range", b, lo, hi, rt, inverted=inv, ctx=ctx),
            lambda: Call(M + "map_remove_by_index", b, idx, rt, ctx=ctx),
            lambda: Call(M + "map_remove_by_index_range", b, idx, cnt, rt, inverted=inv, ctx=ctx),
            lambda: Call(M + "map_remove_by_rank", b, idx, rt, ctx=ctx),
            lambda: Call(M + "map_remove_by_rank_range", b, idx, cnt, rt, inverted=inv, ctx=ctx),
            lambda: Call(M + "map_remove_by_value", b, v, rt, inverted=inv, ctx=ctx),
            lambda: Call(M + "map_remove_by_value_list", b, vals, rt,
                         inverted=inv and bool(vals), ctx=ctx),
            lambda: Call(M + "map_remove_by_value_range", b, lo, hi, rt, inverted=inv, ctx=ctx),
        ])()

    def bit_policy(self):
        if not self.chance(0.3):
            return None
        flag = self.pick(["BIT_WRITE_DEFAULT", "BIT_WRITE_CREATE_ONLY", "BIT_WRITE_UPDATE_ONLY",
                          "BIT_WRITE_NO_FAIL", "BIT_WRITE_PARTIAL"])
        return {"bit_write_flags": sym(flag)}

    def bit_op(self):
        b, off = self.bin_for("b"), self.pick([0, 1, 7, 8, 13, 30])
        size = self.pick([1, 3, 8, 12, 16])
        pol, value = self.bit_policy(), self.pick([b"\x01", b"\xff", b"\x80\x01"])
        sign, action = self.chance(0.3), sym(self.pick(["BIT_OVERFLOW_FAIL",
                                                        "BIT_OVERFLOW_SATURATE",
                                                        "BIT_OVERFLOW_WRAP"]))
        B = "bitwise_operations."
        return self.rng.choice([
            lambda: Call(B + "bit_resize", b, self.pick([0, 1, 4, 9]), policy=pol,
                         resize_flags=sym(self.pick(["BIT_RESIZE_DEFAULT", "BIT_RESIZE_FROM_FRONT",
                                                     "BIT_RESIZE_GROW_ONLY",
                                                     "BIT_RESIZE_SHRINK_ONLY"]))),
            lambda: Call(B + "bit_insert", b, self.pick([0, 1, 3]), len(value), value, policy=pol),
            lambda: Call(B + "bit_remove", b, self.pick([0, 1]), self.pick([1, 2]), policy=pol),
            lambda: Call(B + "bit_set", b, off, size, len(value), value, policy=pol),
            lambda: Call(B + "bit_or", b, off, size, len(value), value, policy=pol),
            lambda: Call(B + "bit_xor", b, off, size, len(value), value, policy=pol),
            lambda: Call(B + "bit_and", b, off, size, len(value), value, policy=pol),
            lambda: Call(B + "bit_not", b, off, size, policy=pol),
            lambda: Call(B + "bit_lshift", b, off, size, self.pick([1, 3]), policy=pol),
            lambda: Call(B + "bit_rshift", b, off, size, self.pick([1, 3]), policy=pol),
            lambda: Call(B + "bit_add", b, off, size, self.pick([1, 200]), sign, action,
                         policy=pol),
            lambda: Call(B + "bit_subtract", b, off, size, self.pick([1, 200]), sign, action,
                         policy=pol),
            lambda: Call(B + "bit_set_int", b, off, size, self.pick([1, 5, 255]), policy=pol),
            lambda: Call(B + "bit_get", b, off, size),
            lambda: Call(B + "bit_count", b, off, size),
            lambda: Call(B + "bit_lscan", b, off, size, self.chance(0.5)),
            lambda: Call(B + "bit_rscan", b, off, size, self.chance(0.5)),
            lambda: Call(B + "bit_get_int", b, off, size, sign),
        ])()

    def hll_op(self):
        b, ibits = self.bin_for("h"), self.pick([4, 6, 8, 16, 3])
        mh = self.pick([None, 0, 4])
        pol = {"flags": sym(self.pick(["HLL_WRITE_DEFAULT", "HLL_WRITE_CREATE_ONLY",
                                       "HLL_WRITE_UPDATE_ONLY", "HLL_WRITE_NO_FAIL",
                                       "HLL_WRITE_ALLOW_FOLD"]))} if self.chance(0.3) else None
        hlls = [Sym(h) for h in self.rng.sample(["HLL_4", "HLL_6_4"], self.rng.randint(1, 2))]
        values = self.rng.sample(["a", "b", "c", "d", 1, 2], self.rng.randint(0, 4))
        H = "hll_operations."
        return self.rng.choice([
            lambda: Call(H + "hll_init", b, ibits, mh, policy=pol),
            lambda: Call(H + "hll_add", b, values, ibits, mh, policy=pol),
            lambda: Call(H + "hll_add", b, values),
            lambda: Call(H + "hll_get_count", b),
            lambda: Call(H + "hll_describe", b),
            lambda: Call(H + "hll_refresh_count", b),
            lambda: Call(H + "hll_fold", b, self.pick([4, 5])),
            lambda: Call(H + "hll_get_union", b, hlls),
            lambda: Call(H + "hll_get_union_count", b, hlls),
            lambda: Call(H + "hll_get_intersect_count", b, hlls),
            lambda: Call(H + "hll_get_similarity", b, hlls),
            lambda: Call(H + "hll_set_union", b, hlls, policy=pol),
        ])()

    def exp_op(self):
        kind = self.pick(["int", "float", "str", "bool", "list", "map", "blob"])
        expr = compiled(self.expr(kind))
        if self.chance(0.5):
            flags = sym(self.pick(["EXP_READ_DEFAULT", "EXP_READ_EVAL_NO_FAIL"]))
            return Call("expression_operations.expression_read", self.pick(["r", "i", "l"]),
                        expr, flags)
        flags = self.rng.sample(["EXP_WRITE_CREATE_ONLY", "EXP_WRITE_UPDATE_ONLY",
                                 "EXP_WRITE_ALLOW_DELETE", "EXP_WRITE_POLICY_NO_FAIL",
                                 "EXP_WRITE_EVAL_NO_FAIL"], self.rng.randint(0, 2))
        flag_src = " | ".join("aerospike." + f for f in flags) or "aerospike.EXP_WRITE_DEFAULT"
        target = {"int": "i", "float": "f", "str": "s", "bool": "x", "list": "l", "map": "m",
                  "blob": "b"}[kind]
        return Call("expression_operations.expression_write", self.bin_for(target), expr,
                    Sym(flag_src))


class Generator(Ops, Policies):
    """One step at a time: single-record commands, operate, batches, scans,
    info commands."""

    STEPS = {"put": 12, "get": 5, "select": 3, "exists": 3, "touch": 3, "remove": 5,
             "remove_bin": 2, "append": 2, "prepend": 2, "increment": 3, "operate": 22,
             "operate_ordered": 6, "batch_read": 4, "batch_operate": 4, "batch_write": 4,
             "batch_remove": 2, "scan": 4, "info": 4, "truncate": 1, "apply": 1}

    def step(self):
        kind = self.rng.choices(list(self.STEPS), list(self.STEPS.values()))[0]
        return getattr(self, "step_" + kind)()

    def _write_kwargs(self):
        policy = self.write_policy(self)
        return {"meta": self.meta(policy), "policy": policy}

    def step_put(self):
        return Call("client.put", self.key(), self.bins(), **self._write_kwargs())

    def step_get(self):
        return Call("client.get", self.key(True), policy=self.read_policy(self))

    def step_select(self):
        return Call("client.select", self.key(True), self.bin_names(allow_empty=True),
                    policy=self.read_policy(self))

    def step_exists(self):
        return Call("client.exists", self.key(True), policy=self.read_policy(self))

    def step_touch(self):
        return Call("client.touch", self.key(True), self.pick([0, 3000, -1]),
                    **self._write_kwargs())

    def step_remove(self):
        policy = {}
        if self.chance(0.1):
            policy["durable_delete"] = False
        if self.chance(0.15):
            policy["gen"] = sym(self.pick(["POLICY_GEN_EQ", "POLICY_GEN_GT"]))
        if self.chance(0.1):
            policy["expressions"] = compiled(self.boolean())
        return Call("client.remove", self.key(True), meta=self.meta(policy), policy=policy or None)

    def step_remove_bin(self):
        return Call("client.remove_bin", self.key(True), self.bin_names(), **self._write_kwargs())

    def step_append(self):
        value = self.pick(STRS) if self.chance(0.8) else self.scalar()
        return Call("client.append", self.key(), self.bin_for("s"), value, **self._write_kwargs())

    def step_prepend(self):
        value = self.pick(STRS) if self.chance(0.8) else self.scalar()
        return Call("client.prepend", self.key(), self.bin_for("s"), value, **self._write_kwargs())

    def step_increment(self):
        return Call("client.increment", self.key(), self.bin_for(self.pick(["i", "f"])),
                    self.pick([1, -5, 0.5, 2**62]), **self._write_kwargs())

    def ops(self, low=1, high=5):
        return [self.op() for _ in range(self.rng.randint(low, high))]

    def step_operate(self):
        return Call("client.operate", self.key(True), self.ops(), **self._write_kwargs())

    def step_operate_ordered(self):
        return Call("client.operate_ordered", self.key(True), self.ops(), **self._write_kwargs())

    def batch_keys(self):
        return [self.key(True) for _ in range(self.rng.randint(1, 4))]

    def step_batch_read(self):
        bins = self.bin_names() if self.chance(0.4) else None
        policy = {"expressions": compiled(self.boolean())} if self.chance(0.15) else None
        return Call("client.batch_read", self.batch_keys(), bins, policy=policy)

    def batch_write_policy(self):
        policy = self.write_policy(self) or {}
        policy.pop("ttl", None)  # batch_operate takes the TTL as an argument
        return policy or None

    def step_batch_operate(self):
        return Call("client.batch_operate", self.batch_keys(), self.ops(1, 3),
                    policy_batch_write=self.batch_write_policy(),
                    ttl=self.pick([None, 0, -1, 3000]))

    def batch_record(self):
        key = self.key(True)
        return self.rng.choice([
            lambda: Call("br.Write", key, self.ops(1, 3), policy=self.batch_write_policy()),
            lambda: Call("br.Read", key, self.ops(1, 2) if self.chance(0.5) else None,
                         read_all_bins=True),
            lambda: Call("br.Remove", key),
        ])()

    def step_batch_write(self):
        records = [self.batch_record() for _ in range(self.rng.randint(1, 4))]
        return Call("client.batch_write", Call("br.BatchRecords", records))

    def step_batch_remove(self):
        policy = {"durable_delete": False} if self.chance(0.2) else None
        return Call("client.batch_remove", self.batch_keys(), policy_batch_remove=policy)

    def step_scan(self):
        bins = self.bin_names() if self.chance(0.5) else None
        policy = {"expressions": compiled(self.boolean())} if self.chance(0.2) else None
        return Call("scan", Sym("client"), Sym("SET"), bins, policy)

    # Info commands whose answers two servers must agree on: reads of state
    # the sequence made, a truncation of its own set, and commands that
    # change data or metadata given an empty, missing or unknown argument
    # (where issue 46 item 1 found "everything" taken for "nothing"). None
    # can touch another sequence's records: namespace bar is never written.
    INFO_READS = ['"namespaces"', '"sets/test/" + SET', '"replicas"']
    INFO_OWN_TRUNCATE = ['"truncate:namespace=test;set=" + SET']
    INFO_EDGES = ['"truncate:namespace=nope;set=" + SET',
                  '"truncate:namespace=;set=" + SET',
                  '"truncate:namespace=test;set=" + SET + ";lut=2147483649"',
                  '"truncate:namespace=test;set="',
                  '"truncate:namespace=bar"',
                  '"truncate:"',
                  '"truncate-namespace:namespace="',
                  '"truncate-namespace:namespace=nope"',
                  '"truncate-undo:namespace=test;set=" + SET',
                  '"truncate-namespace-undo:namespace=bar"',
                  '"sindex-delete:ns=nope;indexname=x"',
                  '"udf-remove:filename="',
                  '"query-abort:id"',
                  '"query-show:id=x"']

    def step_info(self):
        group = self.rng.choices([self.INFO_READS, self.INFO_OWN_TRUNCATE, self.INFO_EDGES],
                                 [4, 2, 4])[0]
        source = self.pick(group)
        name = source.split('"')[1].split(":")[0].split("/")[0]
        return Call("info", Sym("client"), Sym(source), label="info " + name)

    def step_truncate(self):
        return Call("client.truncate", NS, Sym("SET"), 0)

    def step_apply(self):
        module, function = self.pick([("", ""), ("nosuchmodule", "f")])
        return Call("client.apply", self.key(), module, function, [])
