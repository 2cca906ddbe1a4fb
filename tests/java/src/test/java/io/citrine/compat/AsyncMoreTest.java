/*
 * More of the official Java client's asynchronous API: operate, exists,
 * delete and touch listeners, an async batch of mixed reads and writes,
 * an async partition scan, and an async info command, all through NIO
 * event loops against citrined.
 */
package io.citrine.compat;

import static org.junit.jupiter.api.Assertions.*;

import com.aerospike.client.AerospikeException;
import com.aerospike.client.BatchRead;
import com.aerospike.client.BatchRecord;
import com.aerospike.client.BatchWrite;
import com.aerospike.client.Bin;
import com.aerospike.client.Key;
import com.aerospike.client.Operation;
import com.aerospike.client.Record;
import com.aerospike.client.listener.BatchOperateListListener;
import com.aerospike.client.listener.DeleteListener;
import com.aerospike.client.listener.ExistsListener;
import com.aerospike.client.listener.InfoListener;
import com.aerospike.client.listener.RecordListener;
import com.aerospike.client.listener.RecordSequenceListener;
import com.aerospike.client.query.PartitionFilter;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

class AsyncMoreTest extends AsyncBase {
    private static <T> T await(CompletableFuture<T> future) throws Exception {
        return future.get(30, TimeUnit.SECONDS);
    }

    private CompletableFuture<Record> operate(Key key, Operation... ops) {
        CompletableFuture<Record> done = new CompletableFuture<>();
        async.operate(loops.next(), new RecordListener() {
            public void onSuccess(Key k, Record record) {
                done.complete(record);
            }

            public void onFailure(AerospikeException e) {
                done.completeExceptionally(e);
            }
        }, null, key, ops);
        return done;
    }

    private CompletableFuture<Boolean> exists(Key key) {
        CompletableFuture<Boolean> done = new CompletableFuture<>();
        async.exists(loops.next(), new ExistsListener() {
            public void onSuccess(Key k, boolean exists) {
                done.complete(exists);
            }

            public void onFailure(AerospikeException e) {
                done.completeExceptionally(e);
            }
        }, null, key);
        return done;
    }

    @Test
    void operateExistsDelete() throws Exception {
        Key k = key("op");
        Record r = await(operate(k, Operation.put(new Bin("n", 5)), Operation.add(new Bin("n", 2)), Operation.get("n")));
        assertEquals(7, r.getInt("n"));
        assertTrue(await(exists(k)));
        CompletableFuture<Boolean> deleted = new CompletableFuture<>();
        async.delete(loops.next(), new DeleteListener() {
            public void onSuccess(Key key, boolean existed) {
                deleted.complete(existed);
            }

            public void onFailure(AerospikeException e) {
                deleted.completeExceptionally(e);
            }
        }, null, k);
        assertTrue(await(deleted));
        assertFalse(await(exists(k)));
        // An error comes back through onFailure with the server's code.
        CompletableFuture<Record> bad = operate(key("absent"), Operation.touch());
        Exception e = assertThrows(Exception.class, () -> await(bad));
        assertTrue(e.getCause() instanceof AerospikeException, e.toString());
        assertEquals(2, ((AerospikeException) e.getCause()).getResultCode());
    }

    @Test
    void asyncMixedBatch() throws Exception {
        for (int i = 0; i < 20; i++) {
            client.put(null, key(i), new Bin("i", i));
        }
        List<BatchRecord> records = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
            records.add(i % 2 == 0
                ? new BatchRead(key(i), true)
                : new BatchWrite(key(i), new Operation[] {Operation.add(new Bin("i", 100))}));
        }
        CompletableFuture<Boolean> done = new CompletableFuture<>();
        async.operate(loops.next(), new BatchOperateListListener() {
            public void onSuccess(List<BatchRecord> list, boolean status) {
                done.complete(status);
            }

            public void onFailure(AerospikeException e) {
                done.completeExceptionally(e);
            }
        }, null, records);
        assertTrue(await(done));
        for (int i = 0; i < 20; i++) {
            assertEquals(0, records.get(i).resultCode);
            if (i % 2 == 0) {
                assertEquals(i, records.get(i).record.getInt("i"));
            }
            assertEquals(i % 2 == 0 ? i : i + 100, client.get(null, key(i)).getInt("i"));
        }
    }

    @Test
    void asyncPartitionScanAndInfo() throws Exception {
        for (int i = 0; i < 60; i++) {
            client.put(null, key(i), new Bin("i", i));
        }
        Set<Long> seen = ConcurrentHashMap.newKeySet();
        CompletableFuture<Void> done = new CompletableFuture<>();
        async.scanPartitions(loops.next(), new RecordSequenceListener() {
            public void onRecord(Key key, Record record) {
                seen.add(record.getLong("i"));
            }

            public void onSuccess() {
                done.complete(null);
            }

            public void onFailure(AerospikeException e) {
                done.completeExceptionally(e);
            }
        }, null, PartitionFilter.all(), NS, set);
        await(done);
        assertEquals(60, seen.size());

        CompletableFuture<Map<String, String>> info = new CompletableFuture<>();
        async.info(loops.next(), new InfoListener() {
            public void onSuccess(Map<String, String> map) {
                info.complete(map);
            }

            public void onFailure(AerospikeException e) {
                info.completeExceptionally(e);
            }
        }, null, async.getNodes()[0], "build", "namespaces");
        Map<String, String> answers = await(info);
        assertNotNull(answers.get("build"));
        assertTrue(answers.get("namespaces").contains("test"));
    }
}
