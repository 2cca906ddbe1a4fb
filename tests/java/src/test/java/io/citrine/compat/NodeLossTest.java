/*
 * A node of the cluster dies (SIGKILL) while the official Java client
 * works: no acknowledged write is lost (two copies of each record), reads
 * and writes go on through the client's retries, and the client drops the
 * dead node from its view. Runs only when scripts/java-client-suite.sh
 * started a cluster (NODES >= 2) and hands it the peers' process ids in
 * CITRINE_PEER_PIDS; it runs after every other test, since it leaves the
 * cluster one node short.
 */
package io.citrine.compat;

import static org.junit.jupiter.api.Assertions.*;

import com.aerospike.client.AerospikeException;
import com.aerospike.client.Bin;
import com.aerospike.client.Key;
import com.aerospike.client.Record;
import com.aerospike.client.policy.Policy;
import com.aerospike.client.policy.WritePolicy;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

class NodeLossTest extends CompatBase {

    @Test
    void killedNodeLosesNoAcknowledgedWrite() throws InterruptedException {
        String pids = System.getenv("CITRINE_PEER_PIDS");
        Assumptions.assumeTrue(pids != null && !pids.isBlank(),
            "needs a cluster started by scripts/java-client-suite.sh NODES>=2");
        int before = client.getNodes().length;
        assertEquals(nodes(), before);

        int n = 600;
        WritePolicy wp = patient(new WritePolicy());
        for (int i = 0; i < n; i++) {
            client.put(wp, key(i), new Bin("v", i));
        }

        long victim = Long.parseLong(pids.trim().split("\\s+")[0]);
        Optional<ProcessHandle> handle = ProcessHandle.of(victim);
        assertTrue(handle.isPresent(), "peer process " + victim);
        assertTrue(handle.get().destroyForcibly(), "SIGKILL to " + victim);

        // Keep writing and reading while the cluster notices and rebalances.
        Policy rp = patient(new Policy());
        List<String> lost = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            client.put(wp, key(i), new Bin("w", i * 2));
            Record r;
            try {
                r = client.get(rp, key(i));
            } catch (AerospikeException e) {
                fail("read of key " + i + " after the node died: " + e.getMessage());
                return;
            }
            if (r == null || r.getValue("v") == null || r.getInt("v") != i) {
                lost.add(i + "=" + r);
            }
        }
        assertEquals(List.of(), lost, "acknowledged writes lost");

        long deadline = System.currentTimeMillis() + 30000;
        while (client.getNodes().length != before - 1 && System.currentTimeMillis() < deadline) {
            Thread.sleep(100);
        }
        assertEquals(before - 1, client.getNodes().length, "the client dropped the dead node");
        for (int i = 0; i < n; i++) {
            Record r = client.get(rp, key(i));
            assertNotNull(r, "key " + i);
            assertEquals(i, r.getInt("v"));
            assertEquals(i * 2, r.getInt("w"));
        }
    }
}
