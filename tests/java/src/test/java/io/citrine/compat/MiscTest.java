/*
 * Smaller contracts the official Java client relies on: records without a
 * set and in the second namespace, float bins, removing the last bin,
 * long keys, large lists, generation checks on delete and touch, batch
 * writes with their own filter, batches across namespaces, and the info
 * answers an operator reads (set object counts, index and UDF lists).
 */
package io.citrine.compat;

import static org.junit.jupiter.api.Assertions.*;

import com.aerospike.client.AerospikeException;
import com.aerospike.client.BatchRecord;
import com.aerospike.client.BatchResults;
import com.aerospike.client.Bin;
import com.aerospike.client.Info;
import com.aerospike.client.Key;
import com.aerospike.client.Language;
import com.aerospike.client.Operation;
import com.aerospike.client.Record;
import com.aerospike.client.ResultCode;
import com.aerospike.client.Value;
import com.aerospike.client.cdt.ListOperation;
import com.aerospike.client.cluster.Node;
import com.aerospike.client.exp.Exp;
import com.aerospike.client.policy.BatchWritePolicy;
import com.aerospike.client.policy.GenerationPolicy;
import com.aerospike.client.policy.WritePolicy;
import com.aerospike.client.query.IndexType;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.junit.jupiter.api.Test;

class MiscTest extends CompatBase {

    @Test
    void recordsWithoutASetAndInTheOtherNamespace() {
        Key noSet = new Key(NS, null, set + "-no-set");
        client.put(null, noSet, new Bin("v", "no set"));
        assertEquals("no set", client.get(null, noSet).getString("v"));
        Key bar = new Key("bar", set, "in-bar");
        client.put(null, bar, new Bin("v", "bar"));
        assertEquals("bar", client.get(null, bar).getString("v"));
        // The same user key in `test` is another record.
        assertNull(client.get(null, key("in-bar")));
        Record[] both = client.get(null, new Key[] {noSet, bar, key("in-bar")});
        assertEquals("no set", both[0].getString("v"));
        assertEquals("bar", both[1].getString("v"));
        assertNull(both[2]);
        assertTrue(client.delete(null, noSet));
        assertTrue(client.delete(null, bar));
    }

    @Test
    void floatBinsAndDoubleArithmetic() {
        Key k = key("float");
        client.put(null, k, new Bin("f", 1.25f), new Bin("d", 0.1));
        client.add(null, k, new Bin("d", 0.2));
        Record r = client.get(null, k);
        assertEquals(1.25, r.getDouble("f"));
        assertEquals(0.1 + 0.2, r.getDouble("d"));
    }

    @Test
    void removingTheLastBinRemovesTheRecord() {
        Key k = key("last-bin");
        client.put(null, k, new Bin("a", 1), new Bin("b", 2));
        client.put(null, k, Bin.asNull("a"));
        assertTrue(client.exists(null, k));
        client.operate(null, k, Operation.put(Bin.asNull("b")));
        assertFalse(client.exists(null, k), "a record with no bins is gone");
    }

    @Test
    void longUserKeyAndManyElementList() {
        char[] chars = new char[4000];
        Arrays.fill(chars, 'k');
        Key k = key(new String(chars));
        List<Value> items = new ArrayList<>();
        for (int i = 0; i < 20000; i++) {
            items.add(Value.get(i));
        }
        client.operate(null, k, ListOperation.appendItems("l", items));
        Record r = client.operate(null, k, ListOperation.size("l"), ListOperation.get("l", 19999));
        assertEquals(Arrays.asList(20000L, 19999L), r.getList("l"));
    }

    @Test
    void generationChecksOnDeleteAndTouch() {
        Key k = key("gen-delete");
        client.put(null, k, new Bin("v", 1));
        client.put(null, k, new Bin("v", 2));
        WritePolicy stale = new WritePolicy();
        stale.generationPolicy = GenerationPolicy.EXPECT_GEN_EQUAL;
        stale.generation = 1;
        AerospikeException touch = assertThrows(AerospikeException.class, () -> client.touch(stale, k));
        assertEquals(ResultCode.GENERATION_ERROR, touch.getResultCode());
        AerospikeException delete = assertThrows(AerospikeException.class, () -> client.delete(stale, k));
        assertEquals(ResultCode.GENERATION_ERROR, delete.getResultCode());
        assertTrue(client.exists(null, k));
        WritePolicy fresh = new WritePolicy();
        fresh.generationPolicy = GenerationPolicy.EXPECT_GEN_EQUAL;
        fresh.generation = 2;
        assertTrue(client.delete(fresh, k));
        assertFalse(client.exists(null, k));
    }

    @Test
    void batchWritesWithTheirOwnFilter() {
        Key[] keys = new Key[6];
        for (int i = 0; i < keys.length; i++) {
            keys[i] = key("bw" + i);
            client.put(null, keys[i], new Bin("i", i));
        }
        BatchWritePolicy odd = new BatchWritePolicy();
        odd.filterExp = Exp.build(Exp.eq(Exp.mod(Exp.intBin("i"), Exp.val(2)), Exp.val(1)));
        BatchResults results = client.operate(null, odd, keys, Operation.put(new Bin("odd", true)));
        assertFalse(results.status, "filtered records are not ok");
        for (int i = 0; i < keys.length; i++) {
            BatchRecord br = results.records[i];
            if (i % 2 == 1) {
                assertEquals(ResultCode.OK, br.resultCode, "key " + i);
                assertTrue(client.get(null, keys[i]).getBoolean("odd"));
            } else {
                assertEquals(ResultCode.FILTERED_OUT, br.resultCode, "key " + i);
                assertNull(client.get(null, keys[i]).getValue("odd"));
            }
        }
    }

    @Test
    void setObjectCountsInInfo() {
        for (int i = 0; i < 25; i++) {
            client.put(null, key(i), new Bin("v", i));
        }
        long total = 0;
        for (Node node : client.getNodes()) {
            String sets = Info.request(null, node, "sets/test/" + set);
            for (String field : sets.split("[:;]")) {
                if (field.startsWith("objects=")) {
                    total += Long.parseLong(field.substring("objects=".length()));
                }
            }
        }
        // Every copy is counted where it is held: one per node of the
        // replication factor.
        assertEquals(25L * Math.min(nodes(), 2), total);
    }

    @Test
    void indexAndUdfListsInInfo() {
        String index = "jmisc_" + Long.toHexString(System.nanoTime());
        client.createIndex(null, NS, set, index, "v", IndexType.NUMERIC).waitTillComplete();
        client.registerUdfString(null, "function one(rec) return 1 end\n", "jmisc.lua", Language.LUA)
            .waitTillComplete(50, 10000);
        try {
            Node node = client.getNodes()[0];
            String indexes = Info.request(null, node, "sindex-list:ns=test");
            assertTrue(indexes.contains("indexname=" + index), indexes);
            assertTrue(indexes.contains("bin=v"), indexes);
            String udfs = Info.request(null, node, "udf-list");
            assertTrue(udfs.contains("filename=jmisc.lua"), udfs);
            client.put(null, key("u"), new Bin("v", 1));
            assertEquals(1L, client.execute(null, key("u"), "jmisc", "one"));
        } finally {
            client.dropIndex(null, NS, set, index).waitTillComplete();
            client.removeUdf(null, "jmisc.lua");
        }
    }
}
