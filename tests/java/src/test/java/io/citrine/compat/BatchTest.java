/*
 * Batch commands through the official Java client: reads of present and
 * missing keys keep the caller's order, a mixed batch of reads, writes,
 * deletes and UDF calls answers a result code per key, and a batch filter
 * applies to each record.
 */
package io.citrine.compat;

import static org.junit.jupiter.api.Assertions.*;

import com.aerospike.client.BatchDelete;
import com.aerospike.client.BatchRead;
import com.aerospike.client.BatchRecord;
import com.aerospike.client.BatchResults;
import com.aerospike.client.BatchWrite;
import com.aerospike.client.Bin;
import com.aerospike.client.Key;
import com.aerospike.client.Operation;
import com.aerospike.client.Record;
import com.aerospike.client.ResultCode;
import com.aerospike.client.exp.Exp;
import com.aerospike.client.policy.BatchPolicy;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

class BatchTest extends CompatBase {

    private Key[] writeKeys(int n) {
        Key[] keys = new Key[n];
        for (int i = 0; i < n; i++) {
            keys[i] = key("bk" + i);
            client.put(null, keys[i], new Bin("i", i), new Bin("s", "v" + i));
        }
        return keys;
    }

    @Test
    void batchGetKeepsOrderAndMarksMissing() {
        Key[] written = writeKeys(50);
        Key[] keys = new Key[60];
        for (int i = 0; i < 60; i++) {
            keys[i] = i % 6 == 5 ? key("missing" + i) : written[i - i / 6];
        }
        Record[] records = client.get(null, keys);
        assertEquals(60, records.length);
        for (int i = 0; i < 60; i++) {
            if (i % 6 == 5) {
                assertNull(records[i], "missing key " + i);
            } else {
                assertEquals(i - i / 6, records[i].getInt("i"));
            }
        }
        boolean[] exists = client.exists(null, keys);
        for (int i = 0; i < 60; i++) {
            assertEquals(i % 6 != 5, exists[i]);
        }
        Record[] headers = client.getHeader(null, keys);
        assertNull(headers[0].bins);
        assertEquals(1, headers[0].generation);
        Record[] some = client.get(null, keys, "s");
        assertEquals(1, some[0].bins.size());
        assertEquals("v0", some[0].getString("s"));
    }

    @Test
    void batchWithFilterExpression() {
        Key[] keys = writeKeys(20);
        BatchPolicy bp = new BatchPolicy();
        bp.filterExp = Exp.build(Exp.eq(Exp.mod(Exp.intBin("i"), Exp.val(2)), Exp.val(0)));
        Record[] records = client.get(bp, keys);
        for (int i = 0; i < 20; i++) {
            if (i % 2 == 0) {
                assertNotNull(records[i]);
            } else {
                assertNull(records[i]);
            }
        }
    }

    @Test
    void mixedBatchOperate() {
        Key[] keys = writeKeys(4);
        List<com.aerospike.client.BatchRecord> list = new ArrayList<>();
        list.add(new BatchRead(keys[0], true));
        list.add(new BatchWrite(keys[1], new Operation[] {
            Operation.add(new Bin("i", 100)), Operation.get("i")}));
        list.add(new BatchDelete(keys[2]));
        list.add(new BatchRead(key("nope"), true));
        list.add(new BatchWrite(key("fresh"), new Operation[] {Operation.put(new Bin("i", -1))}));
        boolean allOk = client.operate(null, list);
        assertFalse(allOk, "a missing key is not ok");
        assertEquals(ResultCode.OK, list.get(0).resultCode);
        assertEquals(0, list.get(0).record.getInt("i"));
        assertEquals(ResultCode.OK, list.get(1).resultCode);
        // A batch write answers every op: the add's nil, then the get.
        assertEquals(java.util.Arrays.asList(null, 101L), list.get(1).record.getList("i"));
        assertEquals(ResultCode.OK, list.get(2).resultCode);
        assertEquals(ResultCode.KEY_NOT_FOUND_ERROR, list.get(3).resultCode);
        assertEquals(ResultCode.OK, list.get(4).resultCode);
        assertFalse(client.exists(null, keys[2]));
        assertEquals(-1, client.get(null, key("fresh")).getInt("i"));
    }

    @Test
    void batchDeleteAndBatchOperateOnKeys() {
        Key[] keys = writeKeys(10);
        BatchResults ops = client.operate(null, null, keys, Operation.add(new Bin("i", 1000)), Operation.get("i"));
        assertTrue(ops.status);
        for (int i = 0; i < 10; i++) {
            assertEquals(java.util.Arrays.asList(null, 1000L + i), ops.records[i].record.getList("i"));
        }
        BatchResults deleted = client.delete(null, null, keys);
        assertTrue(deleted.status);
        for (BatchRecord br : deleted.records) {
            assertEquals(ResultCode.OK, br.resultCode);
        }
        for (boolean e : client.exists(null, keys)) {
            assertFalse(e);
        }
    }

    @Test
    void largeBatch() {
        Key[] keys = writeKeys(600);
        Record[] records = client.get(null, keys);
        for (int i = 0; i < keys.length; i++) {
            assertEquals(i, records[i].getInt("i"));
        }
    }
}
