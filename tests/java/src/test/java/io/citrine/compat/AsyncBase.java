/*
 * What the async tests share: NIO event loops (two, at most 16 commands in
 * flight on each: more wait in the client's queue, where without a limit
 * the client would refuse them once a loop's share of maxConnsPerNode is
 * in use, its own rule, not the server's) and an async client on them.
 */
package io.citrine.compat;

import com.aerospike.client.AerospikeClient;
import com.aerospike.client.async.EventLoops;
import com.aerospike.client.async.EventPolicy;
import com.aerospike.client.async.NioEventLoops;
import com.aerospike.client.policy.ClientPolicy;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;

abstract class AsyncBase extends CompatBase {
    static EventLoops loops;
    static AerospikeClient async;

    @BeforeAll
    static void startLoops() {
        EventPolicy eventPolicy = new EventPolicy();
        eventPolicy.maxCommandsInProcess = 16;
        loops = new NioEventLoops(eventPolicy, 2);
        ClientPolicy policy = clientPolicy();
        policy.eventLoops = loops;
        policy.maxConnsPerNode = 64;
        async = new AerospikeClient(policy, host(), port());
    }

    @AfterAll
    static void stopLoops() {
        if (async != null) {
            async.close();
            async = null;
        }
        if (loops != null) {
            loops.close();
            loops = null;
        }
    }
}
