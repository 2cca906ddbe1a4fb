/*
 * Read and write policies that change where a command goes or how the
 * server answers it: every replica policy (including a rack-aware client
 * preferring its rack), reads that consult every copy, writes acknowledged
 * by the master alone, respond-all-ops, and a client that is told the
 * cluster's name. With NODES=3 these route to replicas and proxies.
 */
package io.citrine.compat;

import static org.junit.jupiter.api.Assertions.*;

import com.aerospike.client.AerospikeClient;
import com.aerospike.client.AerospikeException;
import com.aerospike.client.Bin;
import com.aerospike.client.Info;
import com.aerospike.client.Key;
import com.aerospike.client.Operation;
import com.aerospike.client.Record;
import com.aerospike.client.policy.ClientPolicy;
import com.aerospike.client.policy.CommitLevel;
import com.aerospike.client.policy.Policy;
import com.aerospike.client.policy.ReadModeAP;
import com.aerospike.client.policy.Replica;
import com.aerospike.client.policy.WritePolicy;
import java.util.Arrays;
import org.junit.jupiter.api.Test;

class PolicyTest extends CompatBase {

    @Test
    void everyReplicaPolicyReadsTheWrite() {
        for (int i = 0; i < 50; i++) {
            client.put(null, key(i), new Bin("v", i));
        }
        for (Replica replica : Replica.values()) {
            Policy p = new Policy();
            p.replica = replica;
            for (int i = 0; i < 50; i++) {
                Record r = client.get(p, key(i));
                assertNotNull(r, replica + " read of key " + i);
                assertEquals(i, r.getInt("v"), replica + " read of key " + i);
            }
        }
    }

    @Test
    void readModeAllAndCommitMaster() {
        WritePolicy master = new WritePolicy();
        master.commitLevel = CommitLevel.COMMIT_MASTER;
        Policy all = new Policy();
        all.readModeAP = ReadModeAP.ALL;
        for (int i = 0; i < 30; i++) {
            client.put(master, key(i), new Bin("v", i));
        }
        for (int i = 0; i < 30; i++) {
            client.put(null, key(i), new Bin("v", i + 100));
            assertEquals(i + 100, client.get(all, key(i)).getInt("v"));
        }
    }

    @Test
    void rackAwareClientPrefersItsRack() {
        ClientPolicy policy = clientPolicy();
        policy.rackAware = true;
        policy.rackId = 0;
        AerospikeClient rackAware = new AerospikeClient(policy, host(), port());
        try {
            Policy prefer = new Policy();
            prefer.replica = Replica.PREFER_RACK;
            for (int i = 0; i < 30; i++) {
                rackAware.put(null, key(i), new Bin("v", i));
                assertEquals(i, rackAware.get(prefer, key(i)).getInt("v"));
            }
            // A rack-aware client learns each node's rack per namespace.
            String racks = Info.request(null, rackAware.getNodes()[0], "rack-ids");
            assertTrue(racks.contains("test:"), racks);
        } finally {
            rackAware.close();
        }
    }

    @Test
    void clusterNameIsChecked() {
        String name = Info.request(null, client.getNodes()[0], "cluster-name");
        assertFalse(name.isEmpty());
        ClientPolicy right = clientPolicy();
        right.clusterName = name;
        AerospikeClient named = new AerospikeClient(right, host(), port());
        try {
            assertEquals(nodes(), named.getNodes().length);
        } finally {
            named.close();
        }
        ClientPolicy wrong = clientPolicy();
        wrong.clusterName = "not-" + name;
        assertThrows(AerospikeException.class, () -> new AerospikeClient(wrong, host(), port()).close());
    }

    @Test
    void respondAllOpsAnswersEveryOp() {
        Key k = key("all-ops");
        WritePolicy wp = new WritePolicy();
        wp.respondAllOps = true;
        Record r = client.operate(wp, k,
            Operation.put(new Bin("a", 1)),
            Operation.add(new Bin("a", 2)),
            Operation.get("a"),
            Operation.put(new Bin("b", "x")),
            Operation.get("b"));
        assertEquals(Arrays.asList(null, null, 3L), r.getList("a"));
        assertEquals(Arrays.asList(null, "x"), r.getList("b"));
    }

    @Test
    void readTouchTtlPercentExtendsTheRecord() throws InterruptedException {
        Key k = key("read-touch");
        WritePolicy wp = new WritePolicy();
        wp.expiration = 10;
        client.put(wp, k, new Bin("v", 1));
        Thread.sleep(2100);
        Policy touchy = new Policy();
        // Touch when less than 90 % of the TTL is left.
        touchy.readTouchTtlPercent = 90;
        Record r = client.get(touchy, k);
        assertEquals(1, r.getInt("v"));
        Record after = client.get(null, k);
        assertTrue(after.getTimeToLive() > 8, "ttl after a touching read " + after.getTimeToLive());
    }

    @Test
    void timeoutsAndRetriesOnAHealthyNode() {
        Policy tight = new Policy();
        tight.totalTimeout = 50;
        tight.socketTimeout = 20;
        tight.maxRetries = 3;
        client.put(null, key("fast"), new Bin("v", 1));
        for (int i = 0; i < 100; i++) {
            assertEquals(1, client.get(tight, key("fast")).getInt("v"));
        }
    }
}
