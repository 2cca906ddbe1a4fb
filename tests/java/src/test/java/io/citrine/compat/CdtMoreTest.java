/*
 * The less travelled corners of the list, map, bit and HLL ops through the
 * official Java client: every return type, inverted selections, relative
 * rank and index ranges, wildcards and infinity in ranges, bounded list
 * writes, bit arithmetic with each overflow action, and HLL set algebra.
 * Each expected value is worked out from the op's definition.
 */
package io.citrine.compat;

import static org.junit.jupiter.api.Assertions.*;

import com.aerospike.client.AerospikeException;
import com.aerospike.client.Bin;
import com.aerospike.client.Key;
import com.aerospike.client.Record;
import com.aerospike.client.ResultCode;
import com.aerospike.client.Value;
import com.aerospike.client.cdt.ListOperation;
import com.aerospike.client.cdt.ListOrder;
import com.aerospike.client.cdt.ListPolicy;
import com.aerospike.client.cdt.ListReturnType;
import com.aerospike.client.cdt.ListWriteFlags;
import com.aerospike.client.cdt.MapOperation;
import com.aerospike.client.cdt.MapOrder;
import com.aerospike.client.cdt.MapPolicy;
import com.aerospike.client.cdt.MapReturnType;
import com.aerospike.client.cdt.MapWriteFlags;
import com.aerospike.client.operation.BitOperation;
import com.aerospike.client.operation.BitOverflowAction;
import com.aerospike.client.operation.BitPolicy;
import com.aerospike.client.operation.HLLOperation;
import com.aerospike.client.operation.HLLPolicy;
import com.aerospike.client.Value.HLLValue;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.junit.jupiter.api.Test;

class CdtMoreTest extends CompatBase {

    private static List<Value> values(Object... items) {
        List<Value> out = new ArrayList<>();
        for (Object item : items) {
            out.add(Value.get(item));
        }
        return out;
    }

    @Test
    void listReturnTypes() {
        Key k = key("list-rt");
        client.put(null, k, new Bin("l", Arrays.asList(7L, 3L, 9L, 1L, 5L)));
        Record r = client.operate(null, k,
            ListOperation.getByValue("l", Value.get(9), ListReturnType.INDEX),
            ListOperation.getByValue("l", Value.get(9), ListReturnType.REVERSE_INDEX),
            ListOperation.getByValue("l", Value.get(9), ListReturnType.RANK),
            ListOperation.getByValue("l", Value.get(9), ListReturnType.REVERSE_RANK),
            ListOperation.getByValue("l", Value.get(9), ListReturnType.COUNT),
            ListOperation.getByValue("l", Value.get(4), ListReturnType.EXISTS),
            ListOperation.getByValueRange("l", Value.get(3), Value.get(8), ListReturnType.VALUE | ListReturnType.INVERTED),
            ListOperation.getByIndexRange("l", 1, 2, ListReturnType.VALUE),
            ListOperation.getByRankRange("l", -2, ListReturnType.VALUE));
        List<?> results = r.getList("l");
        assertEquals(Arrays.asList(
            List.of(2L), List.of(2L), List.of(4L), List.of(0L), 1L, false,
            Arrays.asList(9L, 1L), Arrays.asList(3L, 9L)), results.subList(0, 8));
        assertEquals(Arrays.asList(7L, 9L), sorted(results.get(8)));
    }

    @Test
    void listRelativeRankAndValueList() {
        Key k = key("list-rel");
        client.put(null, k, new Bin("l", Arrays.asList(0L, 4L, 5L, 9L, 11L, 15L)));
        Record r = client.operate(null, k,
            // Values at ranks from (rank of 5) - 1, two of them: 4 and 5.
            ListOperation.getByValueRelativeRankRange("l", Value.get(5), -1, 2, ListReturnType.VALUE),
            // From the first value >= 10 to the end: 11, 15.
            ListOperation.getByValueRelativeRankRange("l", Value.get(10), 0, ListReturnType.VALUE),
            ListOperation.getByValueList("l", values(15L, 0L, 3L), ListReturnType.INDEX),
            ListOperation.removeByValueRelativeRankRange("l", Value.get(5), 1, 1, ListReturnType.VALUE));
        List<?> results = r.getList("l");
        // The values of a rank range of an unordered list come in an order
        // the server chooses (the reference's heap order): compare sorted.
        assertEquals(Arrays.asList(4L, 5L), sorted(results.get(0)));
        assertEquals(Arrays.asList(11L, 15L), sorted(results.get(1)));
        assertEquals(Arrays.asList(0L, 5L), results.get(2));
        assertEquals(Arrays.asList(9L), results.get(3));
        assertEquals(Arrays.asList(0L, 4L, 5L, 11L, 15L), client.get(null, k).getList("l"));
    }

    @Test
    void listWildcardAndInfinity() {
        Key k = key("list-wild");
        List<Object> items = new ArrayList<>();
        items.add(Arrays.asList("a", 1L));
        items.add(Arrays.asList("b", 2L));
        items.add(Arrays.asList("a", 3L));
        client.put(null, k, new Bin("l", items));
        Record r = client.operate(null, k,
            ListOperation.getByValue("l", Value.get(Arrays.asList(Value.get("a"), Value.WILDCARD)), ListReturnType.INDEX),
            ListOperation.getByValueRange("l",
                Value.get(Arrays.asList(Value.get("b"))), Value.INFINITY, ListReturnType.COUNT));
        assertEquals(Arrays.asList(Arrays.asList(0L, 2L), 1L), r.getList("l"));
    }

    @Test
    void listIncrementTrimAndBoundedInsert() {
        Key k = key("list-more");
        client.put(null, k, new Bin("l", Arrays.asList(1L, 2L, 3L, 4L, 5L)));
        Record r = client.operate(null, k,
            ListOperation.increment("l", 1, Value.get(10)),
            ListOperation.trim("l", 1, 3),
            ListOperation.getRange("l", 0));
        assertEquals(Arrays.asList(12L, 2L, Arrays.asList(12L, 3L, 4L)), r.getList("l"));
        ListPolicy bounded = new ListPolicy(ListOrder.UNORDERED, ListWriteFlags.INSERT_BOUNDED);
        client.operate(null, k, ListOperation.insert(bounded, "l", 3, Value.get(99)));
        assertEquals(Arrays.asList(12L, 3L, 4L, 99L), client.get(null, k).getList("l"));
        AerospikeException e = assertThrows(AerospikeException.class,
            () -> client.operate(null, k, ListOperation.increment("l", 0, Value.get("x"))));
        assertEquals(ResultCode.PARAMETER_ERROR, e.getResultCode());
    }

    @Test
    void mapReturnTypes() {
        Key k = key("map-rt");
        MapPolicy ordered = new MapPolicy(MapOrder.KEY_ORDERED, MapWriteFlags.DEFAULT);
        Map<Value, Value> items = new HashMap<>();
        items.put(Value.get("d"), Value.get(4));
        items.put(Value.get("a"), Value.get(1));
        items.put(Value.get("c"), Value.get(3));
        items.put(Value.get("b"), Value.get(2));
        client.operate(null, k, MapOperation.putItems(ordered, "m", items));
        Record r = client.operate(null, k,
            MapOperation.getByKey("m", Value.get("c"), MapReturnType.INDEX),
            MapOperation.getByKey("m", Value.get("c"), MapReturnType.REVERSE_RANK),
            MapOperation.getByKey("m", Value.get("z"), MapReturnType.EXISTS),
            MapOperation.getByKeyRange("m", Value.get("b"), Value.get("d"), MapReturnType.KEY_VALUE),
            MapOperation.getByValueRange("m", Value.get(2), null, MapReturnType.COUNT),
            MapOperation.getByRankRange("m", 0, 2, MapReturnType.KEY | MapReturnType.INVERTED),
            MapOperation.getByKeyRelativeIndexRange("m", Value.get("b"), 1, 2, MapReturnType.VALUE));
        List<?> results = r.getList("m");
        assertEquals(2L, results.get(0));
        assertEquals(1L, results.get(1));
        assertEquals(false, results.get(2));
        Object kv = results.get(3);
        // KEY_VALUE comes back as a list of entries.
        List<String> pairs = new ArrayList<>();
        for (Object e : (List<?>) kv) {
            Map.Entry<?, ?> entry = (Map.Entry<?, ?>) e;
            pairs.add(entry.getKey() + "=" + entry.getValue());
        }
        assertEquals(Arrays.asList("b=2", "c=3"), pairs);
        assertEquals(3L, results.get(4));
        assertEquals(Arrays.asList("c", "d"), results.get(5));
        assertEquals(Arrays.asList(3L, 4L), results.get(6));

        Record maps = client.operate(null, k,
            MapOperation.getByKeyRange("m", Value.get("a"), Value.get("c"), MapReturnType.ORDERED_MAP),
            MapOperation.getByKeyRange("m", Value.get("c"), null, MapReturnType.UNORDERED_MAP));
        List<?> two = maps.getList("m");
        assertEquals(new TreeMap<>(Map.of("a", 1L, "b", 2L)), new TreeMap<>((Map<?, ?>) two.get(0)));
        assertEquals(Map.of("c", 3L, "d", 4L), new HashMap<>((Map<?, ?>) two.get(1)));
    }

    @Test
    void mapWriteFlagsAndRemoves() {
        Key k = key("map-flags");
        MapPolicy updateOnly = new MapPolicy(MapOrder.UNORDERED, MapWriteFlags.UPDATE_ONLY);
        AerospikeException e = assertThrows(AerospikeException.class,
            () -> client.operate(null, k, MapOperation.put(updateOnly, "m", Value.get("a"), Value.get(1))));
        assertEquals(ResultCode.ELEMENT_NOT_FOUND, e.getResultCode());
        MapPolicy lenient = new MapPolicy(MapOrder.UNORDERED,
            MapWriteFlags.CREATE_ONLY | MapWriteFlags.NO_FAIL | MapWriteFlags.PARTIAL);
        Map<Value, Value> items = new HashMap<>();
        items.put(Value.get("a"), Value.get(1));
        items.put(Value.get("b"), Value.get(2));
        client.operate(null, k, MapOperation.putItems(lenient, "m", items));
        Map<Value, Value> again = new HashMap<>();
        again.put(Value.get("a"), Value.get(100));
        again.put(Value.get("c"), Value.get(3));
        client.operate(null, k, MapOperation.putItems(lenient, "m", again));
        assertEquals(Map.of("a", 1L, "b", 2L, "c", 3L), client.get(null, k).getMap("m"));
        Record r = client.operate(null, k,
            MapOperation.removeByKeyList("m", values("a", "zz"), MapReturnType.VALUE),
            MapOperation.removeByValue("m", Value.get(3), MapReturnType.KEY),
            MapOperation.size("m"));
        assertEquals(Arrays.asList(Arrays.asList(1L), Arrays.asList("c"), 1L), r.getList("m"));
    }

    @Test
    void bitArithmeticAndScans() {
        Key k = key("bit-math");
        client.put(null, k, new Bin("b", new byte[] {(byte) 0xfe, 0x00, 0x0f}));
        Record r = client.operate(null, k,
            BitOperation.add(BitPolicy.Default, "b", 0, 8, 1, false, BitOverflowAction.FAIL),
            BitOperation.getInt("b", 0, 8, false),
            BitOperation.add(BitPolicy.Default, "b", 0, 8, 5, false, BitOverflowAction.WRAP),
            BitOperation.getInt("b", 0, 8, false),
            BitOperation.subtract(BitPolicy.Default, "b", 8, 8, 1, false, BitOverflowAction.SATURATE),
            BitOperation.getInt("b", 8, 8, false),
            BitOperation.lscan("b", 0, 24, true),
            BitOperation.rscan("b", 0, 24, true),
            BitOperation.lshift(BitPolicy.Default, "b", 16, 8, 4),
            BitOperation.get("b", 16, 8));
        List<?> results = r.getList("b");
        assertEquals(255L, results.get(1));
        assertEquals(4L, results.get(3), "255 + 5 wraps to 4");
        assertEquals(0L, results.get(5), "0 - 1 saturates at 0");
        assertEquals(5L, results.get(6), "first set bit of 0x04 0x00 0x0f");
        assertEquals(23L, results.get(7), "last set bit");
        assertArrayEquals(new byte[] {(byte) 0xf0}, (byte[]) results.get(9));
        AerospikeException e = assertThrows(AerospikeException.class,
            () -> client.operate(null, k,
                BitOperation.add(BitPolicy.Default, "b", 0, 8, 255, false, BitOverflowAction.FAIL)));
        assertEquals(ResultCode.OP_NOT_APPLICABLE, e.getResultCode());
    }

    @Test
    void hllSetAlgebra() {
        Key k = key("hll-sets");
        List<Value> left = new ArrayList<>();
        List<Value> right = new ArrayList<>();
        for (int i = 0; i < 2000; i++) {
            left.add(Value.get("x" + i));
            right.add(Value.get("x" + (i + 1000)));
        }
        client.operate(null, k,
            HLLOperation.add(HLLPolicy.Default, "l", left, 14),
            HLLOperation.add(HLLPolicy.Default, "r", right, 14));
        Record bins = client.get(null, k);
        HLLValue rightHll = bins.getHLLValue("r");
        Record r = client.operate(null, k,
            HLLOperation.getUnionCount("l", List.of(rightHll)),
            HLLOperation.getIntersectCount("l", List.of(rightHll)),
            HLLOperation.getSimilarity("l", List.of(rightHll)));
        List<?> results = r.getList("l");
        long union = (Long) results.get(0);
        long intersect = (Long) results.get(1);
        double similarity = (Double) results.get(2);
        assertTrue(Math.abs(union - 3000) < 150, "union " + union);
        assertTrue(Math.abs(intersect - 1000) < 200, "intersection " + intersect);
        assertTrue(Math.abs(similarity - 1.0 / 3) < 0.07, "similarity " + similarity);
        client.operate(null, k, HLLOperation.setUnion(HLLPolicy.Default, "l", List.of(rightHll)));
        long merged = client.operate(null, k, HLLOperation.getCount("l")).getLong("l");
        assertTrue(Math.abs(merged - 3000) < 150, "merged " + merged);
    }
}
