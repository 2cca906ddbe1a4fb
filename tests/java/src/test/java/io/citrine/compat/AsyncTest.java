/*
 * The official Java client's asynchronous API (NIO event loops: its own
 * connection pools and non-blocking sockets) against citrined: many
 * writes and reads in flight at once, an async batch and an async query.
 */
package io.citrine.compat;

import static org.junit.jupiter.api.Assertions.*;

import com.aerospike.client.AerospikeException;
import com.aerospike.client.Bin;
import com.aerospike.client.Key;
import com.aerospike.client.Record;
import com.aerospike.client.listener.RecordArrayListener;
import com.aerospike.client.listener.RecordListener;
import com.aerospike.client.listener.RecordSequenceListener;
import com.aerospike.client.listener.WriteListener;
import com.aerospike.client.query.Statement;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;

class AsyncTest extends AsyncBase {

    @Test
    void asyncWritesReadsBatchAndQuery() throws InterruptedException {
        int n = 500;
        AtomicReference<Throwable> failure = new AtomicReference<>();
        CountDownLatch written = new CountDownLatch(n);
        for (int i = 0; i < n; i++) {
            async.put(loops.next(), new WriteListener() {
                public void onSuccess(Key key) {
                    written.countDown();
                }

                public void onFailure(AerospikeException e) {
                    failure.compareAndSet(null, e);
                    written.countDown();
                }
            }, null, key(i), new Bin("i", i));
        }
        assertTrue(written.await(30, TimeUnit.SECONDS), "writes finished");
        assertNull(failure.get());

        Set<Long> read = ConcurrentHashMap.newKeySet();
        CountDownLatch reads = new CountDownLatch(n);
        for (int i = 0; i < n; i++) {
            async.get(loops.next(), new RecordListener() {
                public void onSuccess(Key key, Record record) {
                    read.add(record.getLong("i"));
                    reads.countDown();
                }

                public void onFailure(AerospikeException e) {
                    failure.compareAndSet(null, e);
                    reads.countDown();
                }
            }, null, key(i));
        }
        assertTrue(reads.await(30, TimeUnit.SECONDS), "reads finished");
        assertNull(failure.get());
        assertEquals(n, read.size());

        Key[] keys = new Key[100];
        for (int i = 0; i < keys.length; i++) {
            keys[i] = key(i * 5);
        }
        CountDownLatch batch = new CountDownLatch(1);
        AtomicReference<Record[]> batchRecords = new AtomicReference<>();
        async.get(loops.next(), new RecordArrayListener() {
            public void onSuccess(Key[] k, Record[] records) {
                batchRecords.set(records);
                batch.countDown();
            }

            public void onFailure(AerospikeException e) {
                failure.compareAndSet(null, e);
                batch.countDown();
            }
        }, null, keys);
        assertTrue(batch.await(30, TimeUnit.SECONDS));
        assertNull(failure.get());
        for (int i = 0; i < keys.length; i++) {
            assertEquals(i * 5, batchRecords.get()[i].getInt("i"));
        }

        Statement stmt = new Statement();
        stmt.setNamespace(NS);
        stmt.setSetName(set);
        Set<Long> queried = ConcurrentHashMap.newKeySet();
        CountDownLatch query = new CountDownLatch(1);
        async.query(loops.next(), new RecordSequenceListener() {
            public void onRecord(Key key, Record record) {
                queried.add(record.getLong("i"));
            }

            public void onSuccess() {
                query.countDown();
            }

            public void onFailure(AerospikeException e) {
                failure.compareAndSet(null, e);
                query.countDown();
            }
        }, null, stmt);
        assertTrue(query.await(30, TimeUnit.SECONDS));
        assertNull(failure.get());
        assertEquals(n, queried.size());
    }
}
