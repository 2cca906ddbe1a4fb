/*
 * operate() through the official Java client: scalar ops mixed with reads
 * in one command, list and map (CDT) ops including nested contexts,
 * bitwise and HyperLogLog ops, and expression read/write ops. The results
 * are compared with what the ops mean, not with what the server happened
 * to answer.
 */
package io.citrine.compat;

import static org.junit.jupiter.api.Assertions.*;

import com.aerospike.client.AerospikeException;
import com.aerospike.client.Bin;
import com.aerospike.client.Key;
import com.aerospike.client.Operation;
import com.aerospike.client.Record;
import com.aerospike.client.ResultCode;
import com.aerospike.client.Value;
import com.aerospike.client.cdt.CTX;
import com.aerospike.client.cdt.ListOperation;
import com.aerospike.client.cdt.ListOrder;
import com.aerospike.client.cdt.ListPolicy;
import com.aerospike.client.cdt.ListReturnType;
import com.aerospike.client.cdt.ListSortFlags;
import com.aerospike.client.cdt.ListWriteFlags;
import com.aerospike.client.cdt.MapOperation;
import com.aerospike.client.cdt.MapOrder;
import com.aerospike.client.cdt.MapPolicy;
import com.aerospike.client.cdt.MapReturnType;
import com.aerospike.client.cdt.MapWriteFlags;
import com.aerospike.client.exp.Exp;
import com.aerospike.client.exp.ExpOperation;
import com.aerospike.client.exp.ExpReadFlags;
import com.aerospike.client.exp.ExpWriteFlags;
import com.aerospike.client.operation.BitOperation;
import com.aerospike.client.operation.BitPolicy;
import com.aerospike.client.operation.HLLOperation;
import com.aerospike.client.operation.HLLPolicy;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class OperateTest extends CompatBase {

    @Test
    void writeAndReadInOneCommand() {
        Key k = key("mixed");
        client.put(null, k, new Bin("n", 1), new Bin("s", "a"));
        Record r = client.operate(null, k,
            Operation.add(new Bin("n", 41)),
            Operation.append(new Bin("s", "b")),
            Operation.put(new Bin("new", "x")),
            Operation.get("n"),
            Operation.get("s"));
        assertEquals(42, r.getInt("n"));
        assertEquals("ab", r.getString("s"));
        assertEquals(2, r.generation);
        Record all = client.operate(null, k, Operation.touch(), Operation.get());
        assertEquals(3, all.bins.size());
        assertEquals("x", all.getString("new"));
    }

    @Test
    void operateCreatesARecordAndDeleteOpRemovesIt() {
        Key k = key("create-delete");
        client.operate(null, k, Operation.put(new Bin("v", 1)));
        assertTrue(client.exists(null, k));
        client.operate(null, k, Operation.delete());
        assertFalse(client.exists(null, k));
    }

    @Test
    void listOps() {
        Key k = key("list");
        client.operate(null, k,
            ListOperation.appendItems("l", Arrays.asList(Value.get(5), Value.get(1), Value.get(4))),
            ListOperation.append("l", Value.get(2)),
            ListOperation.insert("l", 0, Value.get(9)));
        Record r = client.operate(null, k,
            ListOperation.size("l"),
            ListOperation.getByIndex("l", -1, ListReturnType.VALUE),
            ListOperation.getByRank("l", 0, ListReturnType.VALUE),
            ListOperation.getByValueRange("l", Value.get(2), Value.get(6), ListReturnType.COUNT));
        List<?> results = r.getList("l");
        assertEquals(Arrays.asList(5L, 2L, 1L, 3L), results);

        client.operate(null, k, ListOperation.sort("l", ListSortFlags.DEFAULT));
        assertEquals(Arrays.asList(1L, 2L, 4L, 5L, 9L), client.get(null, k).getList("l"));

        Record removed = client.operate(null, k,
            ListOperation.removeByValue("l", Value.get(4), ListReturnType.INDEX),
            ListOperation.pop("l", 0));
        assertEquals(Arrays.asList(Arrays.asList(2L), 1L), removed.getList("l"));
        assertEquals(Arrays.asList(2L, 5L, 9L), client.get(null, k).getList("l"));

        // Setting past the end pads with nils ...
        client.operate(null, k, ListOperation.set("l", 5, Value.get(1)));
        assertEquals(Arrays.asList(2L, 5L, 9L, null, null, 1L), client.get(null, k).getList("l"));
        // ... unless the write is bounded.
        ListPolicy bounded = new ListPolicy(ListOrder.UNORDERED, ListWriteFlags.INSERT_BOUNDED);
        AerospikeException e = assertThrows(AerospikeException.class,
            () -> client.operate(null, k, ListOperation.insert(bounded, "l", 10, Value.get(1))));
        assertEquals(ResultCode.OP_NOT_APPLICABLE, e.getResultCode());
        assertEquals(6, client.get(null, k).getList("l").size());
    }

    @Test
    void orderedListWithUniqueFlags() {
        Key k = key("ordered-list");
        ListPolicy ordered = new ListPolicy(ListOrder.ORDERED,
            ListWriteFlags.ADD_UNIQUE | ListWriteFlags.NO_FAIL | ListWriteFlags.PARTIAL);
        client.operate(null, k,
            ListOperation.appendItems(ordered, "l",
                Arrays.asList(Value.get(30), Value.get(10), Value.get(20), Value.get(10))));
        assertEquals(Arrays.asList(10L, 20L, 30L), client.get(null, k).getList("l"));
        ListPolicy strict = new ListPolicy(ListOrder.ORDERED, ListWriteFlags.ADD_UNIQUE);
        AerospikeException e = assertThrows(AerospikeException.class,
            () -> client.operate(null, k, ListOperation.append(strict, "l", Value.get(20))));
        assertEquals(ResultCode.ELEMENT_EXISTS, e.getResultCode());
    }

    @Test
    void mapOps() {
        Key k = key("map");
        MapPolicy keyOrdered = new MapPolicy(MapOrder.KEY_ORDERED, MapWriteFlags.DEFAULT);
        Map<Value, Value> items = new HashMap<>();
        items.put(Value.get("c"), Value.get(3));
        items.put(Value.get("a"), Value.get(10));
        items.put(Value.get("b"), Value.get(2));
        client.operate(null, k, MapOperation.putItems(keyOrdered, "m", items));
        Record r = client.operate(null, k,
            MapOperation.increment(keyOrdered, "m", Value.get("a"), Value.get(5)),
            MapOperation.getByKey("m", Value.get("b"), MapReturnType.VALUE),
            MapOperation.getByRank("m", -1, MapReturnType.KEY),
            MapOperation.getByIndexRange("m", 0, 2, MapReturnType.KEY),
            MapOperation.size("m"));
        assertEquals(Arrays.asList(15L, 2L, "a", Arrays.asList("a", "b"), 3L), r.getList("m"));

        MapPolicy createOnly = new MapPolicy(MapOrder.KEY_ORDERED, MapWriteFlags.CREATE_ONLY);
        AerospikeException e = assertThrows(AerospikeException.class,
            () -> client.operate(null, k, MapOperation.put(createOnly, "m", Value.get("a"), Value.get(0))));
        assertEquals(ResultCode.ELEMENT_EXISTS, e.getResultCode());

        Record removed = client.operate(null, k,
            MapOperation.removeByValueRange("m", Value.get(0), Value.get(5), MapReturnType.KEY));
        assertEquals(Arrays.asList("b", "c"), removed.getList("m"));
        Map<?, ?> left = client.get(null, k).getMap("m");
        assertEquals(Map.of("a", 15L), left);
    }

    @Test
    void nestedContexts() {
        Key k = key("nested");
        Map<String, Object> inner = new HashMap<>();
        inner.put("scores", new ArrayList<>(Arrays.asList(3L, 1L)));
        client.put(null, k, new Bin("doc", Map.of("user", inner)));
        client.operate(null, k,
            ListOperation.append("doc", Value.get(7), CTX.mapKey(Value.get("user")), CTX.mapKey(Value.get("scores"))));
        Record r = client.operate(null, k,
            ListOperation.getByRankRange("doc", -2, 2, ListReturnType.VALUE,
                CTX.mapKey(Value.get("user")), CTX.mapKey(Value.get("scores"))));
        // Values of a rank range of an unordered list: order the server's.
        assertEquals(Arrays.asList(3L, 7L), sorted(r.getList("doc")));

        // A context that creates what is missing.
        client.operate(null, k,
            MapOperation.put(MapPolicy.Default, "doc", Value.get("x"), Value.get(1),
                CTX.mapKeyCreate(Value.get("made"), MapOrder.KEY_ORDERED)));
        Map<?, ?> doc = client.get(null, k).getMap("doc");
        assertEquals(Map.of("x", 1L), doc.get("made"));
    }

    @Test
    void bitOps() {
        Key k = key("bits");
        client.put(null, k, new Bin("b", new byte[] {0b0000_0001, 0b0100_0010}));
        Record r = client.operate(null, k,
            BitOperation.set(BitPolicy.Default, "b", 0, 8, new byte[] {(byte) 0xff}),
            BitOperation.count("b", 0, 16),
            BitOperation.getInt("b", 8, 8, false),
            BitOperation.get("b", 0, 16));
        // A modify op in the command makes the client ask for every op's
        // result: the set answers nil.
        List<?> results = r.getList("b");
        assertEquals(4, results.size());
        assertNull(results.get(0));
        assertEquals(10L, results.get(1));
        assertEquals(0x42L, results.get(2));
        assertArrayEquals(new byte[] {(byte) 0xff, 0x42}, (byte[]) results.get(3));

        client.operate(null, k, BitOperation.resize(BitPolicy.Default, "b", 4, 0));
        assertArrayEquals(new byte[] {(byte) 0xff, 0x42, 0, 0}, client.get(null, k).getBytes("b"));
    }

    @Test
    void hllOps() {
        Key k = key("hll");
        List<Value> entries = new ArrayList<>();
        for (int i = 0; i < 1000; i++) {
            entries.add(Value.get("item-" + i));
        }
        client.operate(null, k, HLLOperation.add(HLLPolicy.Default, "h", entries, 12));
        Record r = client.operate(null, k, HLLOperation.getCount("h"));
        long count = r.getLong("h");
        assertTrue(count > 900 && count < 1100, "estimate " + count);
        Record d = client.operate(null, k, HLLOperation.describe("h"));
        assertEquals(Arrays.asList(12L, 0L), d.getList("h"));
    }

    @Test
    void expressionReadAndWriteOps() {
        Key k = key("expops");
        client.put(null, k, new Bin("a", 6), new Bin("b", 7));
        Record r = client.operate(null, k,
            ExpOperation.write("c", Exp.build(Exp.mul(Exp.intBin("a"), Exp.intBin("b"))), ExpWriteFlags.DEFAULT),
            ExpOperation.read("sum", Exp.build(Exp.add(Exp.intBin("a"), Exp.intBin("b"))), ExpReadFlags.DEFAULT));
        assertEquals(13L, r.getLong("sum"));
        assertEquals(42, client.get(null, k).getInt("c"));

        AerospikeException e = assertThrows(AerospikeException.class,
            () -> client.operate(null, k,
                ExpOperation.write("c", Exp.build(Exp.val(1)), ExpWriteFlags.CREATE_ONLY)));
        assertEquals(ResultCode.BIN_EXISTS_ERROR, e.getResultCode());
    }
}
