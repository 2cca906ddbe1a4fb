/*
 * Single-record commands through the official Java client: every bin type
 * round-trips, the write policies (exists actions, generation checks, TTL)
 * answer with the result codes the client expects, and the record's
 * metadata (generation, time to live) is what the server reports.
 */
package io.citrine.compat;

import static org.junit.jupiter.api.Assertions.*;

import com.aerospike.client.AerospikeException;
import com.aerospike.client.Bin;
import com.aerospike.client.Info;
import com.aerospike.client.Key;
import com.aerospike.client.Record;
import com.aerospike.client.ResultCode;
import com.aerospike.client.Value;
import com.aerospike.client.cluster.Node;
import com.aerospike.client.policy.GenerationPolicy;
import com.aerospike.client.policy.Policy;
import com.aerospike.client.policy.RecordExistsAction;
import com.aerospike.client.policy.WritePolicy;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class KvTest extends CompatBase {

    @Test
    void everyBinTypeRoundTrips() {
        Key k = key("types");
        Map<String, Object> map = new HashMap<>();
        map.put("a", 1L);
        map.put("b", "two");
        byte[] blob = {0, 1, 2, (byte) 0xff};
        client.put(null, k,
            new Bin("i", 42),
            new Bin("neg", -7_000_000_000L),
            new Bin("d", 2.5),
            new Bin("s", "héllo"),
            new Bin("bytes", blob),
            new Bin("bool", true),
            new Bin("list", Arrays.asList(1L, "x", 3.5)),
            new Bin("map", map),
            Bin.asGeoJSON("geo", "{\"type\":\"Point\",\"coordinates\":[-122.0,37.5]}"));
        Record r = client.get(null, k);
        assertNotNull(r);
        assertEquals(42, r.getInt("i"));
        assertEquals(-7_000_000_000L, r.getLong("neg"));
        assertEquals(2.5, r.getDouble("d"));
        assertEquals("héllo", r.getString("s"));
        assertArrayEquals(blob, r.getBytes("bytes"));
        assertTrue(r.getBoolean("bool"));
        assertEquals(Arrays.asList(1L, "x", 3.5), r.getList("list"));
        assertEquals(map, r.getMap("map"));
        assertTrue(r.getGeoJSONString("geo").contains("Point"));
        assertEquals(1, r.generation);
    }

    @Test
    void integerAndBlobUserKeysAddressRecords() {
        client.put(null, key(77L), new Bin("v", "int key"));
        client.put(null, key(new byte[] {9, 8, 7}), new Bin("v", "blob key"));
        assertEquals("int key", client.get(null, key(77L)).getString("v"));
        assertEquals("blob key", client.get(null, key(new byte[] {9, 8, 7})).getString("v"));
        assertNull(client.get(null, key(78L)));
    }

    @Test
    void getSelectedBinsAndHeader() {
        Key k = key("sel");
        client.put(null, k, new Bin("a", 1), new Bin("b", 2), new Bin("c", 3));
        Record r = client.get(null, k, "a", "c");
        assertEquals(2, r.bins.size());
        assertEquals(1, r.getInt("a"));
        assertEquals(3, r.getInt("c"));
        Record h = client.getHeader(null, k);
        assertNotNull(h);
        assertNull(h.bins);
        assertEquals(1, h.generation);
    }

    @Test
    void missingRecordReadsAsNull() {
        assertNull(client.get(null, key("nothing-here")));
        assertFalse(client.exists(null, key("nothing-here")));
        assertNull(client.getHeader(null, key("nothing-here")));
    }

    @Test
    void deleteExistsAndNullBinRemovesBin() {
        Key k = key("del");
        client.put(null, k, new Bin("a", 1), new Bin("b", 2));
        assertTrue(client.exists(null, k));
        client.put(null, k, Bin.asNull("b"));
        Record r = client.get(null, k);
        assertEquals(1, r.bins.size());
        assertEquals(2, r.generation);
        assertTrue(client.delete(null, k));
        assertFalse(client.exists(null, k));
        assertFalse(client.delete(null, k));
    }

    @Test
    void addAppendPrependAndTouch() {
        Key k = key("arith");
        client.put(null, k, new Bin("n", 10), new Bin("s", "mid"));
        client.add(null, k, new Bin("n", 5));
        client.append(null, k, new Bin("s", "-end"));
        client.prepend(null, k, new Bin("s", "start-"));
        client.touch(null, k);
        Record r = client.get(null, k);
        assertEquals(15, r.getInt("n"));
        assertEquals("start-mid-end", r.getString("s"));
        assertEquals(5, r.generation);
    }

    @Test
    void addToStringBinIsABinTypeError() {
        Key k = key("badadd");
        client.put(null, k, new Bin("s", "text"));
        AerospikeException e = assertThrows(AerospikeException.class,
            () -> client.add(null, k, new Bin("s", 1)));
        assertEquals(ResultCode.BIN_TYPE_ERROR, e.getResultCode());
        assertEquals("text", client.get(null, k).getString("s"));
    }

    @Test
    void touchOfAMissingRecordIsKeyNotFound() {
        AerospikeException e = assertThrows(AerospikeException.class,
            () -> client.touch(null, key("absent")));
        assertEquals(ResultCode.KEY_NOT_FOUND_ERROR, e.getResultCode());
    }

    @Test
    void recordExistsActions() {
        Key k = key("exists-actions");
        WritePolicy create = new WritePolicy();
        create.recordExistsAction = RecordExistsAction.CREATE_ONLY;
        client.put(create, k, new Bin("a", 1), new Bin("b", 1));
        AerospikeException dup = assertThrows(AerospikeException.class,
            () -> client.put(create, k, new Bin("a", 2)));
        assertEquals(ResultCode.KEY_EXISTS_ERROR, dup.getResultCode());

        WritePolicy updateOnly = new WritePolicy();
        updateOnly.recordExistsAction = RecordExistsAction.UPDATE_ONLY;
        AerospikeException missing = assertThrows(AerospikeException.class,
            () -> client.put(updateOnly, key("exists-actions-2"), new Bin("a", 2)));
        assertEquals(ResultCode.KEY_NOT_FOUND_ERROR, missing.getResultCode());

        WritePolicy replace = new WritePolicy();
        replace.recordExistsAction = RecordExistsAction.REPLACE;
        client.put(replace, k, new Bin("c", 3));
        Record r = client.get(null, k);
        assertEquals(Map.of("c", 3L), r.bins);

        WritePolicy replaceOnly = new WritePolicy();
        replaceOnly.recordExistsAction = RecordExistsAction.REPLACE_ONLY;
        AerospikeException noRecord = assertThrows(AerospikeException.class,
            () -> client.put(replaceOnly, key("exists-actions-3"), new Bin("a", 1)));
        assertEquals(ResultCode.KEY_NOT_FOUND_ERROR, noRecord.getResultCode());
    }

    @Test
    void generationCheck() {
        Key k = key("gen");
        client.put(null, k, new Bin("v", 1));
        client.put(null, k, new Bin("v", 2));
        WritePolicy wp = new WritePolicy();
        wp.generationPolicy = GenerationPolicy.EXPECT_GEN_EQUAL;
        wp.generation = 1;
        AerospikeException e = assertThrows(AerospikeException.class,
            () -> client.put(wp, k, new Bin("v", 3)));
        assertEquals(ResultCode.GENERATION_ERROR, e.getResultCode());
        wp.generation = 2;
        client.put(wp, k, new Bin("v", 3));
        Record r = client.get(null, k);
        assertEquals(3, r.getInt("v"));
        assertEquals(3, r.generation);

        WritePolicy gt = new WritePolicy();
        gt.generationPolicy = GenerationPolicy.EXPECT_GEN_GT;
        gt.generation = 3;
        assertThrows(AerospikeException.class, () -> client.put(gt, k, new Bin("v", 4)));
        gt.generation = 10;
        client.put(gt, k, new Bin("v", 4));
        assertEquals(4, client.get(null, k).getInt("v"));
    }

    @Test
    void timeToLive() {
        Key k = key("ttl");
        WritePolicy wp = new WritePolicy();
        wp.expiration = 1000;
        client.put(wp, k, new Bin("v", 1));
        int ttl = client.get(null, k).getTimeToLive();
        assertTrue(ttl > 990 && ttl <= 1000, "ttl " + ttl);

        // -2: keep the record's TTL on update.
        WritePolicy keep = new WritePolicy();
        keep.expiration = -2;
        client.put(keep, k, new Bin("v", 2));
        ttl = client.get(null, k).getTimeToLive();
        assertTrue(ttl > 990 && ttl <= 1000, "ttl after -2 " + ttl);

        // -1: never expire; the client reports that as -1.
        WritePolicy never = new WritePolicy();
        never.expiration = -1;
        client.put(never, k, new Bin("v", 3));
        assertEquals(-1, client.get(null, k).getTimeToLive());

        // touch with a new TTL.
        WritePolicy touch = new WritePolicy();
        touch.expiration = 500;
        client.touch(touch, k);
        ttl = client.get(null, k).getTimeToLive();
        assertTrue(ttl > 490 && ttl <= 500, "ttl after touch " + ttl);
    }

    @Test
    void recordExpires() throws InterruptedException {
        Key k = key("expires");
        WritePolicy wp = new WritePolicy();
        wp.expiration = 1;
        client.put(wp, k, new Bin("v", 1));
        assertTrue(client.exists(null, k));
        long deadline = System.currentTimeMillis() + 5000;
        while (client.exists(null, k) && System.currentTimeMillis() < deadline) {
            Thread.sleep(100);
        }
        assertFalse(client.exists(null, k), "a 1 s record still exists after 5 s");
    }

    @Test
    void sendKeyStoresTheUserKey() {
        Key k = key("stored-key");
        WritePolicy wp = new WritePolicy();
        wp.sendKey = true;
        client.put(wp, k, new Bin("v", 1));
        final Value[] seen = new Value[1];
        client.scanAll(null, NS, set, (key, record) -> seen[0] = key.userKey);
        assertNotNull(seen[0], "the scan returned no user key");
        assertEquals("stored-key", seen[0].toString());
    }

    @Test
    void longestBinNameRoundTrips() {
        // 15 bytes, the most a bin name may have (the client itself refuses
        // 16, so a longer one never reaches the server).
        Key k = key("binname");
        client.put(null, k, new Bin("fifteen_chars__", 1));
        assertEquals(1, client.get(null, k).getInt("fifteen_chars__"));
    }

    @Test
    void unknownNamespaceIsAnError() {
        AerospikeException e = assertThrows(AerospikeException.class,
            () -> client.put(null, new Key("no_such_ns", set, "k"), new Bin("v", 1)));
        // The client finds no partition map for a namespace the server
        // does not have.
        assertEquals(ResultCode.INVALID_NAMESPACE, e.getResultCode());
    }

    @Test
    void compressedCommandsRoundTrip() {
        Key k = key("compressed");
        WritePolicy wp = new WritePolicy();
        wp.compress = true;
        char[] big = new char[20000];
        Arrays.fill(big, 'z');
        String value = new String(big);
        long before = compressedRequests();
        client.put(wp, k, new Bin("big", value));
        Policy rp = new Policy();
        rp.compress = true;
        assertEquals(value, client.get(rp, k).getString("big"));
        // The put really went compressed (the node counts what it inflated).
        assertTrue(compressedRequests() > before, "no compressed request reached the node");
    }

    /** Compressed requests the nodes inflated so far. */
    private static long compressedRequests() {
        long total = 0;
        for (Node node : client.getNodes()) {
            total += Long.parseLong(stat(Info.request(null, node, "statistics"), "compressed_requests"));
        }
        return total;
    }

    @Test
    void largeRecordRoundTrips() {
        Key k = key("large");
        byte[] blob = new byte[512 * 1024];
        for (int i = 0; i < blob.length; i++) {
            blob[i] = (byte) (i * 31);
        }
        client.put(null, k, new Bin("blob", blob));
        assertArrayEquals(blob, client.get(null, k).getBytes("blob"));
    }

    @Test
    void manyBinsRoundTrip() {
        Key k = key("many");
        Bin[] bins = new Bin[200];
        for (int i = 0; i < bins.length; i++) {
            bins[i] = new Bin("b" + i, i);
        }
        client.put(null, k, bins);
        Record r = client.get(null, k);
        assertEquals(200, r.bins.size());
        assertEquals(199, r.getInt("b199"));
    }
}
