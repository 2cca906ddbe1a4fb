/*
 * Filter expressions through the official Java client: a record the
 * expression rejects is not read or written (FILTERED_OUT when the policy
 * asks for it), record metadata (TTL, set name, key, digest modulo) is
 * visible to expressions, and let/cond/regex evaluate as documented.
 */
package io.citrine.compat;

import static org.junit.jupiter.api.Assertions.*;

import com.aerospike.client.AerospikeException;
import com.aerospike.client.Bin;
import com.aerospike.client.Key;
import com.aerospike.client.Operation;
import com.aerospike.client.Record;
import com.aerospike.client.ResultCode;
import com.aerospike.client.exp.Exp;
import com.aerospike.client.exp.ExpOperation;
import com.aerospike.client.exp.ExpReadFlags;
import com.aerospike.client.policy.Policy;
import com.aerospike.client.policy.WritePolicy;
import com.aerospike.client.query.RegexFlag;
import org.junit.jupiter.api.Test;

class ExpTest extends CompatBase {

    @Test
    void filteredReadIsNullOrFilteredOut() {
        Key k = key("filtered");
        client.put(null, k, new Bin("age", 30));
        Policy pass = new Policy();
        pass.filterExp = Exp.build(Exp.gt(Exp.intBin("age"), Exp.val(18)));
        assertEquals(30, client.get(pass, k).getInt("age"));

        Policy reject = new Policy();
        reject.filterExp = Exp.build(Exp.lt(Exp.intBin("age"), Exp.val(18)));
        assertNull(client.get(reject, k));
        reject.failOnFilteredOut = true;
        AerospikeException e = assertThrows(AerospikeException.class, () -> client.get(reject, k));
        assertEquals(ResultCode.FILTERED_OUT, e.getResultCode());
    }

    @Test
    void filteredWriteLeavesTheRecordAlone() {
        Key k = key("filtered-write");
        client.put(null, k, new Bin("state", "locked"), new Bin("v", 1));
        WritePolicy wp = new WritePolicy();
        wp.filterExp = Exp.build(Exp.eq(Exp.stringBin("state"), Exp.val("open")));
        wp.failOnFilteredOut = true;
        AerospikeException e = assertThrows(AerospikeException.class,
            () -> client.put(wp, k, new Bin("v", 2)));
        assertEquals(ResultCode.FILTERED_OUT, e.getResultCode());
        Record r = client.get(null, k);
        assertEquals(1, r.getInt("v"));
        assertEquals(1, r.generation);
        AerospikeException d = assertThrows(AerospikeException.class, () -> client.delete(wp, k));
        assertEquals(ResultCode.FILTERED_OUT, d.getResultCode());
        assertTrue(client.exists(null, k));
    }

    @Test
    void metadataInExpressions() {
        Key k = key("meta");
        WritePolicy wp = new WritePolicy();
        wp.expiration = 3600;
        wp.sendKey = true;
        client.put(wp, k, new Bin("v", 1));
        Record r = client.operate(null, k,
            ExpOperation.read("ttl", Exp.build(Exp.ttl()), ExpReadFlags.DEFAULT),
            ExpOperation.read("set", Exp.build(Exp.setName()), ExpReadFlags.DEFAULT),
            ExpOperation.read("key", Exp.build(Exp.key(Exp.Type.STRING)), ExpReadFlags.DEFAULT),
            ExpOperation.read("haskey", Exp.build(Exp.keyExists()), ExpReadFlags.DEFAULT),
            ExpOperation.read("since", Exp.build(Exp.sinceUpdate()), ExpReadFlags.DEFAULT));
        long ttl = r.getLong("ttl");
        assertTrue(ttl > 3590 && ttl <= 3600, "ttl " + ttl);
        assertEquals(set, r.getString("set"));
        assertEquals("meta", r.getString("key"));
        assertTrue(r.getBoolean("haskey"));
        long since = r.getLong("since");
        assertTrue(since >= 0 && since < 60_000, "since-update ms " + since);
    }

    @Test
    void digestModuloSplitsKeys() {
        int[] seen = new int[3];
        for (int i = 0; i < 30; i++) {
            Key k = key("dm" + i);
            client.put(null, k, new Bin("v", i));
            Record r = client.operate(null, k,
                ExpOperation.read("m", Exp.build(Exp.digestModulo(3)), ExpReadFlags.DEFAULT));
            long m = r.getLong("m");
            assertTrue(m >= 0 && m < 3);
            // The client computes the same digest: its last four bytes,
            // little-endian, modulo 3 (as the server documents).
            byte[] d = k.digest;
            long tail = (d[16] & 0xffL) | (d[17] & 0xffL) << 8 | (d[18] & 0xffL) << 16 | (d[19] & 0xffL) << 24;
            assertEquals(tail % 3, m, "digest modulo of key dm" + i);
            seen[(int) m]++;
        }
        assertTrue(seen[0] > 0 && seen[1] > 0 && seen[2] > 0);
    }

    @Test
    void letCondAndRegex() {
        Key k = key("let");
        client.put(null, k, new Bin("a", 5), new Bin("b", 9), new Bin("name", "Citrine-DB"));
        Exp bigger = Exp.let(
            Exp.def("x", Exp.intBin("a")),
            Exp.def("y", Exp.intBin("b")),
            Exp.cond(Exp.gt(Exp.var("x"), Exp.var("y")), Exp.var("x"), Exp.var("y")));
        Record r = client.operate(null, k,
            ExpOperation.read("max", Exp.build(bigger), ExpReadFlags.DEFAULT),
            ExpOperation.read("re", Exp.build(
                Exp.regexCompare("^citrine-", RegexFlag.ICASE, Exp.stringBin("name"))), ExpReadFlags.DEFAULT),
            ExpOperation.read("nore", Exp.build(
                Exp.regexCompare("^citrine-", RegexFlag.NONE, Exp.stringBin("name"))), ExpReadFlags.DEFAULT));
        assertEquals(9L, r.getLong("max"));
        assertTrue(r.getBoolean("re"));
        assertFalse(r.getBoolean("nore"));
    }

    @Test
    void missingBinInAFilterIsNotAMatch() {
        Key k = key("nobin");
        client.put(null, k, new Bin("a", 1));
        Policy p = new Policy();
        p.filterExp = Exp.build(Exp.eq(Exp.intBin("absent"), Exp.val(1)));
        assertNull(client.get(p, k));
        Policy exists = new Policy();
        exists.filterExp = Exp.build(Exp.not(Exp.binExists("absent")));
        assertNotNull(client.get(exists, k));
    }

    @Test
    void expressionEvaluationErrorIsReported() {
        Key k = key("experr");
        client.put(null, k, new Bin("s", "text"));
        // Adding to a string bin cannot be evaluated.
        AerospikeException e = assertThrows(AerospikeException.class,
            () -> client.operate(null, k, ExpOperation.read("x",
                Exp.build(Exp.add(Exp.intBin("s"), Exp.val(1))), ExpReadFlags.DEFAULT)));
        assertEquals(ResultCode.OP_NOT_APPLICABLE, e.getResultCode());
        Record r = client.operate(null, k, ExpOperation.read("x",
            Exp.build(Exp.add(Exp.intBin("s"), Exp.val(1))), ExpReadFlags.EVAL_NO_FAIL), Operation.get("s"));
        assertNull(r.getValue("x"));
        assertEquals("text", r.getString("s"));
    }
}
