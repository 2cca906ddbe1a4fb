/*
 * Lua UDFs through the official Java client: register, call on a record,
 * errors raised by the function, batch and background UDF calls, and a
 * stream aggregation (the server runs the map stage, the client's own Lua
 * the reduce stage).
 */
package io.citrine.compat;

import static org.junit.jupiter.api.Assertions.*;

import com.aerospike.client.AerospikeException;
import com.aerospike.client.BatchRecord;
import com.aerospike.client.BatchResults;
import com.aerospike.client.Bin;
import com.aerospike.client.Key;
import com.aerospike.client.Language;
import com.aerospike.client.ResultCode;
import com.aerospike.client.Value;
import com.aerospike.client.lua.LuaConfig;
import com.aerospike.client.query.ResultSet;
import com.aerospike.client.query.Statement;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

class UdfTest extends CompatBase {
    static final String MODULE = "jcompat";
    static final String SOURCE = String.join("\n",
        "function add_bin(rec, bin, n)",
        "  rec[bin] = (rec[bin] or 0) + n",
        "  if aerospike:exists(rec) then aerospike:update(rec) else aerospike:create(rec) end",
        "  return rec[bin]",
        "end",
        "function fail(rec, msg)",
        "  error(msg)",
        "end",
        "function echo(rec, v)",
        "  return v",
        "end",
        "local function value_of(rec)",
        "  return rec['i']",
        "end",
        "local function add(a, b)",
        "  return a + b",
        "end",
        "function sum(stream)",
        "  return stream : map(value_of) : reduce(add)",
        "end",
        "");
    static Path luaDir;

    @BeforeAll
    static void register() throws IOException {
        client.registerUdfString(null, SOURCE, MODULE + ".lua", Language.LUA).waitTillComplete(50, 10000);
        // The client runs the aggregation's reduce stage itself, from its
        // own copy of the module.
        luaDir = Files.createTempDirectory("citrine-lua");
        Files.writeString(luaDir.resolve(MODULE + ".lua"), SOURCE);
        LuaConfig.SourceDirectory = luaDir.toString();
    }

    @AfterAll
    static void unregister() throws IOException {
        if (client != null) {
            client.removeUdf(null, MODULE + ".lua");
        }
        if (luaDir != null) {
            Files.deleteIfExists(luaDir.resolve(MODULE + ".lua"));
            Files.deleteIfExists(luaDir);
        }
    }

    @Test
    void recordUdfUpdatesAndReturns() {
        Key k = key("udf");
        Object first = client.execute(null, k, MODULE, "add_bin", Value.get("n"), Value.get(5));
        assertEquals(5L, first);
        Object second = client.execute(null, k, MODULE, "add_bin", Value.get("n"), Value.get(7));
        assertEquals(12L, second);
        assertEquals(12, client.get(null, k).getInt("n"));
    }

    @Test
    void udfValuesRoundTrip() {
        Key k = key("echo");
        client.put(null, k, new Bin("x", 1));
        assertEquals("text", client.execute(null, k, MODULE, "echo", Value.get("text")));
        assertEquals(List.of(1L, "two"), client.execute(null, k, MODULE, "echo", Value.get(List.of(1L, "two"))));
        assertEquals(Map.of("k", 2.5), client.execute(null, k, MODULE, "echo", Value.get(Map.of("k", 2.5))));
    }

    @Test
    void udfErrorReachesTheCaller() {
        Key k = key("boom");
        client.put(null, k, new Bin("x", 1));
        AerospikeException e = assertThrows(AerospikeException.class,
            () -> client.execute(null, k, MODULE, "fail", Value.get("went wrong")));
        assertEquals(ResultCode.UDF_BAD_RESPONSE, e.getResultCode());
        assertTrue(e.getMessage().contains("went wrong"), e.getMessage());
    }

    @Test
    void unknownFunctionIsAnError() {
        Key k = key("nofn");
        client.put(null, k, new Bin("x", 1));
        AerospikeException e = assertThrows(AerospikeException.class,
            () -> client.execute(null, k, MODULE, "no_such_function"));
        assertEquals(ResultCode.UDF_BAD_RESPONSE, e.getResultCode());
    }

    @Test
    void batchUdf() {
        Key[] keys = new Key[10];
        for (int i = 0; i < keys.length; i++) {
            keys[i] = key("b" + i);
            client.put(null, keys[i], new Bin("n", i));
        }
        BatchResults results = client.execute(null, null, keys, MODULE, "add_bin", Value.get("n"), Value.get(100));
        assertTrue(results.status);
        for (int i = 0; i < keys.length; i++) {
            BatchRecord br = results.records[i];
            assertEquals(ResultCode.OK, br.resultCode);
            assertEquals(100L + i, br.record.getUDFResult());
            assertEquals(100 + i, client.get(null, keys[i]).getInt("n"));
        }
    }

    @Test
    void backgroundUdf() {
        for (int i = 0; i < 30; i++) {
            client.put(null, key(i), new Bin("n", i));
        }
        Statement stmt = new Statement();
        stmt.setNamespace(NS);
        stmt.setSetName(set);
        client.execute(null, stmt, MODULE, "add_bin", Value.get("n"), Value.get(1000)).waitTillComplete(50, 20000);
        AtomicInteger updated = new AtomicInteger();
        client.scanAll(null, NS, set, (key, record) -> {
            if (record.getInt("n") >= 1000) {
                updated.incrementAndGet();
            }
        });
        assertEquals(30, updated.get());
    }

    @Test
    void streamAggregation() {
        long expected = 0;
        for (int i = 0; i < 50; i++) {
            client.put(null, key(i), new Bin("i", i));
            expected += i;
        }
        Statement stmt = new Statement();
        stmt.setNamespace(NS);
        stmt.setSetName(set);
        long sum;
        int results = 0;
        try (ResultSet rs = client.queryAggregate(null, stmt, MODULE, "sum")) {
            sum = 0;
            while (rs.next()) {
                sum = (Long) rs.getObject();
                results++;
            }
        }
        assertEquals(1, results, "one reduced value");
        assertEquals(expected, sum);
    }

    /**
     * Bins selected beside a stream UDF do not refuse the aggregation (the
     * reference runs it) nor narrow the records its stream sees; over a set
     * never written, with a filter whose bin has no index, it answers
     * nothing (the reference's answer; a plain query there answers 201).
     */
    @Test
    void aggregationSelectingBinsAndOverASetNeverWritten() {
        long expected = 0;
        for (int i = 0; i < 20; i++) {
            client.put(null, key(i), new Bin("i", i), new Bin("other", -i));
            expected += i;
        }
        Statement stmt = new Statement();
        stmt.setNamespace(NS);
        stmt.setSetName(set);
        stmt.setBinNames("other");
        stmt.setAggregateFunction(MODULE, "sum");
        try (ResultSet rs = client.queryAggregate(null, stmt)) {
            assertTrue(rs.next(), "one reduced value");
            assertEquals(expected, (Long) rs.getObject());
            assertFalse(rs.next());
        }
        Statement never = new Statement();
        never.setNamespace(NS);
        never.setSetName(set + "_never");
        never.setFilter(com.aerospike.client.query.Filter.range("i", 0, 10));
        never.setAggregateFunction(MODULE, "sum");
        try (ResultSet rs = client.queryAggregate(null, never)) {
            assertFalse(rs.next(), "no records, no value");
        }
        Statement plain = new Statement();
        plain.setNamespace(NS);
        plain.setSetName(set + "_never");
        plain.setFilter(com.aerospike.client.query.Filter.range("i", 0, 10));
        AerospikeException error = assertThrows(AerospikeException.class, () -> {
            try (com.aerospike.client.query.RecordSet rs = client.query(null, plain)) {
                rs.next();
            }
        });
        assertEquals(ResultCode.INDEX_NOTFOUND, error.getResultCode());
    }
}
