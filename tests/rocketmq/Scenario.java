import java.io.BufferedReader;
import java.io.FileWriter;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.RPCHook;
import org.apache.rocketmq.remoting.protocol.admin.ConsumeStats;
import org.apache.rocketmq.remoting.protocol.admin.OffsetWrapper;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * The real-broker scenario of the test suite, written against RocketMQ's official Java client. It plays
 * scripted transaction fates and records, as JSON lines, what it did and what it saw (every check the
 * broker sent and the answer given): the truth the pipeline's findings are compared with.
 *
 * <pre>
 * java Scenario txn   NAMESRV OUT CHECK_MAX CHECK_INTERVAL_MS   transactions, checks, a two-member consumer group
 * java Scenario reset NAMESRV OUT TIMESTAMP_MS                  the group offline, its offsets reset back in time
 * java Scenario young NAMESRV OUT                               halves still pending when the store is read
 * java Scenario bulk  NAMESRV OUT COUNT                         COUNT plain messages to BulkTopic, in batches
 * java Scenario conflict NAMESRV OUT SECONDS                    group CG_CONFLICT: one member on TopicA, one on
 *                                                                TopicB (the classic mistake), kept SECONDS
 *                                                                from a line "members" once both started
 * java Scenario member NAMESRV OUT GROUP TOPIC NAME PERSIST_MS  one member of GROUP on TOPIC, persisting its
 *                                                                offsets every PERSIST_MS, until it is killed or
 *                                                                its stdin closes; every message it consumes is
 *                                                                a line in OUT. A line "pause" on stdin: it stops
 *                                                                pulling at the next message it consumes; "flush":
 *                                                                it hands its trace contexts to their sender
 * java Scenario send  NAMESRV OUT TOPIC COUNT [batched]         COUNT plain messages to TOPIC, keys TOPIC-n; batched:
 *                                                                one batch per queue, stored at once
 * java Scenario retry NAMESRV OUT COUNT FAIL                    CG_RETRY (maxReconsumeTimes 2) on TopicR: COUNT
 *                                                                messages R-n and one committed transaction R-txn;
 *                                                                it fails R-0..R-(FAIL-1) and R-txn every time, so
 *                                                                the broker parks them in %DLQ%CG_RETRY; "retried"
 *                                                                once they were tried 3 times, then every send and
 *                                                                attempt; ends when stdin closes
 * java Scenario tags  NAMESRV OUT COUNT [TOPIC GROUP OK_GROUP] TOPIC (TopicT) read by GROUP (CG_TAGS: member t1
 *                                                                with TagA, t2 with TagB 1.5 s later) and OK_GROUP
 *                                                                (CG_OK: two with *); "ready" once they run; each
 *                                                                "send" on stdin: COUNT more messages tagged TagA
 *                                                                and TagB in turn, then those and every message
 *                                                                received since once both groups have committed
 *                                                                past all, and "tags_done"; ends when stdin closes
 * </pre>
 *
 * With -Dacl.accessKey=... -Dacl.secretKey=... every client signs its requests (AclClientRPCHook).
 *
 * Fates (the message key is FATE-n; the listener answers by fate, the way the application it stands for would):
 * COMMIT, ROLLBACK: decided at once; a check answers from the decision (a check that beats the batched op
 *   commits a second time). The client sends every end request oneway and never learns whether it arrived,
 *   so "finals" counts the final messages as the consumers received them. CHECK_COMMIT, CHECK_ROLLBACK: UNKNOW at first, decided by the first check.
 * UNKNOW_FOREVER: every answer UNKNOW, so the broker discards it after CHECK_MAX checks.
 * ORPHAN_SENDER: sent by a second member of the group that exits at once; the check reaches the other member,
 *   which commits it.
 * GONE: sent by a producer group that exits at once; nobody is left to check, the broker discards it.
 * SLOW_NO_CHECKER: the local transaction commits after 3.5 s; the application answers every check UNKNOW.
 * IMMUNITY: CHECK_IMMUNITY_TIME_IN_SECONDS=10, commits after 3.5 s; the broker's immunity copies stay open.
 * LATE_COMMIT: the local transaction outlives the discard (it waits for the CHECK_MAX-th check, then 4 intervals).
 * YOUNG: UNKNOW, sent just before the store is read: still pending.
 */
public final class Scenario {
    static final String TOPIC = "TxnTopic";
    /** -Dtrace=true: the producers and members are built with enableMsgTrace (RMQ_SYS_TRACE_TOPIC). */
    static final boolean TRACE = Boolean.getBoolean("trace");
    static final String GROUP = "CG_RECON";
    static final Map<String, Txn> TXNS = new ConcurrentHashMap<>();
    static final AtomicLong LAST_CHECK = new AtomicLong();
    /** The final messages the group received, by uniq key: "queue:offset", each a message of its own. */
    static final Map<String, Set<String>> FINALS = new ConcurrentHashMap<>();

    static final class Txn {
        final String fate;
        final String group;
        final String sender;
        final long sentAt = System.currentTimeMillis();
        String uniqKey;
        long halfQueueOffset = -1;
        volatile String local = "PENDING";  // what executeLocalTransaction answered
        volatile long localAt;
        volatile String decision = "PENDING";  // the application's table: what a check answers from
        volatile int lastCheckTimes;  // TRANSACTION_CHECK_TIMES of the latest check: the broker's count
        final List<String> checks = new ArrayList<>();

        Txn(String fate, String group, String sender) {
            this.fate = fate;
            this.group = group;
            this.sender = sender;
        }

        synchronized String json() {
            return "{\"kind\":\"txn\",\"uniq_key\":\"" + uniqKey + "\",\"fate\":\"" + fate + "\",\"producer_group\":\""
                + group + "\",\"sender\":\"" + sender + "\",\"half_queue_offset\":" + halfQueueOffset
                + ",\"sent_at\":" + sentAt + ",\"local\":\"" + local + "\",\"local_at\":" + localAt
                + ",\"decision\":\"" + decision + "\",\"finals\":" + FINALS.getOrDefault(uniqKey, Set.of()).size()
                + ",\"checks\":[" + String.join(",", checks) + "]}";
        }
    }

    /** The application behind one producer: local transactions and check answers, by fate. */
    static final class App implements TransactionListener {
        final String member;

        App(String member) {
            this.member = member;
        }

        @Override
        public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
            Txn t = (Txn) arg;
            try {
                switch (t.fate) {
                    case "COMMIT": return local(t, decide(t, LocalTransactionState.COMMIT_MESSAGE));
                    case "ROLLBACK": return local(t, decide(t, LocalTransactionState.ROLLBACK_MESSAGE));
                    case "SLOW_NO_CHECKER":
                    case "IMMUNITY":
                        Thread.sleep(3500);
                        return local(t, decide(t, LocalTransactionState.COMMIT_MESSAGE));
                    case "LATE_COMMIT":
                        // By the broker's count: a check sent to a member that was shutting down is lost, and
                        // counts all the same (the broker numbers each check before it sends it).
                        while (t.lastCheckTimes < checkMax) {
                            Thread.sleep(100);
                        }
                        Thread.sleep(checkIntervalMs * 4);
                        return local(t, decide(t, LocalTransactionState.COMMIT_MESSAGE));
                    default: return local(t, LocalTransactionState.UNKNOW);
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return LocalTransactionState.UNKNOW;
            }
        }

        @Override
        public LocalTransactionState checkLocalTransaction(MessageExt msg) {
            Txn t = TXNS.get(msg.getKeys());
            if (t == null) {
                return LocalTransactionState.UNKNOW;
            }
            LocalTransactionState answer;
            switch (t.fate) {
                case "CHECK_COMMIT":
                    answer = t.decision.equals("PENDING") ? decide(t, LocalTransactionState.COMMIT_MESSAGE) : table(t);
                    break;
                case "CHECK_ROLLBACK":
                    answer = t.decision.equals("PENDING") ? decide(t, LocalTransactionState.ROLLBACK_MESSAGE) : table(t);
                    break;
                case "ORPHAN_SENDER":  // the sender is gone; this member finds the order and commits it
                    answer = t.decision.equals("PENDING") ? decide(t, LocalTransactionState.COMMIT_MESSAGE) : table(t);
                    break;
                case "UNKNOW_FOREVER":
                case "SLOW_NO_CHECKER":
                case "LATE_COMMIT":
                case "YOUNG":
                    answer = LocalTransactionState.UNKNOW;
                    break;
                default:
                    answer = table(t);
            }
            synchronized (t) {
                // A RIP-82 broker (5.4+) keeps the count in RocksDB and sends the original half, without it:
                // then the checks seen are counted.
                String times = msg.getProperty("TRANSACTION_CHECK_TIMES");
                t.lastCheckTimes = times == null ? t.lastCheckTimes + 1 : Integer.parseInt(times);
                t.checks.add("{\"times\":" + times + ",\"queue_offset\":"
                    + msg.getQueueOffset() + ",\"answer\":\"" + name(answer) + "\",\"at\":"
                    + System.currentTimeMillis() + ",\"by\":\"" + member + "\"}");
            }
            LAST_CHECK.set(System.currentTimeMillis());
            return answer;
        }
    }

    static int checkMax;
    static long checkIntervalMs;

    static LocalTransactionState decide(Txn t, LocalTransactionState state) {
        t.decision = name(state);
        return state;
    }

    static LocalTransactionState local(Txn t, LocalTransactionState state) {
        t.local = name(state);
        t.localAt = System.currentTimeMillis();
        return state;
    }

    /** What an application that keeps its decisions answers: the decision, or UNKNOW while there is none. */
    static LocalTransactionState table(Txn t) {
        switch (t.decision) {
            case "COMMIT": return LocalTransactionState.COMMIT_MESSAGE;
            case "ROLLBACK": return LocalTransactionState.ROLLBACK_MESSAGE;
            default: return LocalTransactionState.UNKNOW;
        }
    }

    static String name(LocalTransactionState s) {
        return s == LocalTransactionState.COMMIT_MESSAGE ? "COMMIT"
            : s == LocalTransactionState.ROLLBACK_MESSAGE ? "ROLLBACK" : "UNKNOW";
    }

    static TransactionMQProducer producer(String namesrv, String group, String member) throws Exception {
        TransactionMQProducer p = new TransactionMQProducer(group, aclHook(), TRACE, null);
        p.setNamesrvAddr(namesrv);
        p.setInstanceName(member);
        p.setTransactionListener(new App(member));
        p.start();
        return p;
    }

    /** When each producer member began to shut down (`leave`), by member. */
    static final Map<String, Long> LEFT = new ConcurrentHashMap<>();

    /**
     * Shuts a producer member down; the time it began is a truth line "left". Its trace contexts not yet sent
     * may be lost: the dispatcher sends in batches (every 5 s or 20 contexts), its last flush sends
     * asynchronously just before the trace producer closes, and checks already in the check executor answer
     * after that flush (seen: a member's UNKNOW answer to a check, in the second it shut down, never traced).
     */
    static void leave(TransactionMQProducer p) {
        LEFT.put(p.getInstanceName(), System.currentTimeMillis());
        p.shutdown();
    }

    static void send(TransactionMQProducer p, String fate, int n, String member) throws Exception {
        Txn t = new Txn(fate, p.getProducerGroup(), member);
        Message msg = new Message(TOPIC, fate.toLowerCase(), fate + "-" + n, ("payload " + fate + " " + n).getBytes());
        if (fate.equals("IMMUNITY")) {
            msg.putUserProperty("CHECK_IMMUNITY_TIME_IN_SECONDS", "10");
        }
        TXNS.put(fate + "-" + n, t);
        TransactionSendResult r = p.sendMessageInTransaction(msg, t);
        synchronized (t) {
            t.uniqKey = r.getMsgId();
            t.halfQueueOffset = r.getQueueOffset();
        }
    }

    static DefaultMQPushConsumer consumer(String namesrv, String member, Map<String, Integer> seen) throws Exception {
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(GROUP);
        c.setNamesrvAddr(namesrv);
        c.setInstanceName(member);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setPersistConsumerOffsetInterval(1000);
        c.subscribe(TOPIC, "*");
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                seen.merge(m.getMsgId(), 1, Integer::sum);
                FINALS.computeIfAbsent(m.getMsgId(), k -> ConcurrentHashMap.newKeySet())
                    .add(m.getQueueId() + ":" + m.getQueueOffset());
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        return c;
    }

    static void txn(String namesrv, PrintWriter out) throws Exception {
        DefaultMQAdminExt admin = admin(namesrv);
        String brokerAddr = admin.examineBrokerClusterInfo().getBrokerAddrTable().values().iterator().next()
            .getBrokerAddrs().get(0L);
        admin.createAndUpdateTopicConfig(brokerAddr, new TopicConfig(TOPIC, 4, 4));
        Thread.sleep(1000);  // the route reaches the name server with the next registration
        admin.shutdown();

        Map<String, Integer> seen1 = new ConcurrentHashMap<>();
        Map<String, Integer> seen2 = new ConcurrentHashMap<>();
        DefaultMQPushConsumer member1 = consumer(namesrv, "member-1", seen1);
        TransactionMQProducer main1 = producer(namesrv, "PG_MAIN", "main-1");
        TransactionMQProducer main2 = producer(namesrv, "PG_MAIN", "main-2");
        // The gone group sends in one burst and exits straight away: its last halves at least are younger than the
        // transaction timeout when it leaves, so their checks find nobody to ask (interleaved with 100 other
        // sends, on a loaded machine all ten had been checked, and answered, before it exited).
        TransactionMQProducer gone = producer(namesrv, "PG_GONE", "gone-1");
        for (int i = 0; i < 10; i++) {
            send(gone, "GONE", i, "gone-1");
        }
        leave(gone);
        ExecutorService slow = Executors.newFixedThreadPool(15);
        for (int i = 0; i < 5; i++) {
            for (String fate : new String[] {"SLOW_NO_CHECKER", "IMMUNITY", "LATE_COMMIT"}) {
                final int n = i;
                slow.submit(() -> {
                    send(main1, fate, n, "main-1");
                    return null;
                });
            }
        }
        String[] fast = {"COMMIT", "COMMIT", "COMMIT", "COMMIT", "ROLLBACK", "ROLLBACK", "CHECK_COMMIT",
            "CHECK_ROLLBACK", "UNKNOW_FOREVER"};
        for (int i = 0; i < 10; i++) {
            for (String fate : fast) {
                send(main1, fate, (int) TXNS.keySet().stream().filter(k -> k.startsWith(fate + "-")).count(), "main-1");
            }
            send(main2, "ORPHAN_SENDER", i, "main-2");
            Thread.sleep(50);
        }
        leave(main2);
        Thread.sleep(3000);
        DefaultMQPushConsumer member2 = consumer(namesrv, "member-2", seen2);  // a rebalance: two members

        slow.shutdown();
        if (!slow.awaitTermination(120, TimeUnit.SECONDS)) {
            throw new IOException("the slow transactions were still running after 120 s");
        }
        // Settled: no check for long enough that every open copy has been checked CHECK_MAX times and
        // discarded, and every batched op is written.
        long quiet = (checkMax + 2) * checkIntervalMs + 6000;
        while (System.currentTimeMillis() - Math.max(LAST_CHECK.get(), lastDecision()) < quiet) {
            Thread.sleep(200);
        }
        awaitDrained(namesrv, 60_000);
        member1.shutdown();
        member2.shutdown();
        leave(main1);
        for (Txn t : TXNS.values()) {
            out.println(t.json());
        }
        LEFT.forEach((member, at) ->
            out.println("{\"kind\":\"left\",\"member\":\"" + member + "\",\"at\":" + at + "}"));
        out.println("{\"kind\":\"consumed\",\"member\":\"member-1\",\"messages\":" + sum(seen1) + "}");
        out.println("{\"kind\":\"consumed\",\"member\":\"member-2\",\"messages\":" + sum(seen2) + "}");
    }

    /** Until the group has consumed and committed all TxnTopic holds (a starved machine can take a while).
     *  Asked of the broker itself (GET_CONSUME_STATS): the route-based overload first sends GET_TOPIC_CONFIG,
     *  which a 4.x broker does not know ("request type 351 not supported"). */
    static void awaitDrained(String namesrv, long timeoutMs) throws Exception {
        awaitDrained(namesrv, GROUP, TOPIC, timeoutMs);
    }

    static void awaitDrained(String namesrv, String group, String topic, long timeoutMs) throws Exception {
        DefaultMQAdminExt admin = admin(namesrv);
        String brokerAddr = admin.examineBrokerClusterInfo().getBrokerAddrTable().values().iterator().next()
            .getBrokerAddrs().get(0L);
        long deadline = System.currentTimeMillis() + timeoutMs;
        while (admin.examineConsumeStats(brokerAddr, group, topic, 3000).computeTotalDiff() > 0) {
            if (System.currentTimeMillis() > deadline) {
                throw new IOException(group + " had not consumed all of " + topic + " after " + timeoutMs + " ms");
            }
            Thread.sleep(200);
        }
        admin.shutdown();
    }

    static long lastDecision() {
        return TXNS.values().stream().mapToLong(t -> t.localAt).max().orElse(0);  // local transactions ended
    }

    static int sum(Map<String, Integer> seen) {
        return seen.values().stream().mapToInt(Integer::intValue).sum();
    }

    static RPCHook aclHook() {
        String key = System.getProperty("acl.accessKey");
        return key == null ? null : new AclClientRPCHook(new SessionCredentials(key, System.getProperty("acl.secretKey")));
    }

    static void bulk(String namesrv, PrintWriter out, int count) throws Exception {
        DefaultMQProducer p = new DefaultMQProducer("PG_BULK", aclHook());
        p.setNamesrvAddr(namesrv);
        p.setInstanceName("bulk");
        p.setDefaultTopicQueueNums(4);
        p.start();
        byte[] body = new byte[200];
        int sent = 0;
        while (sent < count) {
            List<Message> batch = new ArrayList<>();
            for (int i = 0; i < 100 && sent < count; i++, sent++) {
                batch.add(new Message("BulkTopic", "bulk", "BULK-" + sent, body));
            }
            p.send(batch);
        }
        out.println("{\"kind\":\"bulk\",\"messages\":" + sent + "}");
        p.shutdown();
    }

    static void conflict(String namesrv, PrintWriter out, int seconds) throws Exception {
        DefaultMQProducer p = new DefaultMQProducer("PG_CONFLICT", aclHook());
        p.setNamesrvAddr(namesrv);
        p.setInstanceName("conflict");
        p.start();
        Map<String, Integer> sent = new TreeMap<>();
        for (String topic : new String[] {"TopicA", "TopicB"}) {
            for (int i = 0; i < 20; i++) {
                SendResult r = p.send(new Message(topic, "c", topic + "-" + i, new byte[10]));
                sent.merge(topic + ":" + r.getMessageQueue().getQueueId(), 1, Integer::sum);
            }
        }
        Map<String, Integer> seen = new ConcurrentHashMap<>();
        List<DefaultMQPushConsumer> members = new ArrayList<>();
        for (String topic : new String[] {"TopicA", "TopicB"}) {
            DefaultMQPushConsumer c = new DefaultMQPushConsumer("CG_CONFLICT", aclHook());
            c.setNamesrvAddr(namesrv);
            c.setInstanceName("member-" + topic);
            c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            c.subscribe(topic, "*");
            c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    seen.merge(m.getTopic() + ":" + m.getQueueId(), 1, Integer::sum);
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            c.start();
            members.add(c);
        }
        out.println("{\"kind\":\"members\"}");  // the phase runs `seconds` from here
        out.flush();
        Thread.sleep(seconds * 1000L);
        out.println("{\"kind\":\"conflict\",\"sent\":" + json(sent) + ",\"consumed\":" + json(seen) + "}");
        for (DefaultMQPushConsumer c : members) {
            c.shutdown();  // the first to leave hands its queues to the other, which may consume them first
        }
        out.println("{\"kind\":\"conflict_end\",\"consumed\":" + json(seen) + "}");
        p.shutdown();
    }

    /** A map of counts as a JSON object. */
    static String json(Map<String, Integer> counts) {
        StringBuilder b = new StringBuilder("{");
        for (Map.Entry<String, Integer> e : new TreeMap<>(counts).entrySet()) {
            b.append(b.length() > 1 ? "," : "").append('"').append(e.getKey()).append("\":").append(e.getValue());
        }
        return b.append('}').toString();
    }

    /** A member that writes each message it consumes at once (it may be killed at any moment). */
    static void member(String namesrv, PrintWriter out, String group, String topic, String name, int persistMs)
            throws Exception {
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(group, aclHook(), new AllocateMessageQueueAveragely(),
            TRACE, null);
        c.setNamesrvAddr(namesrv);
        c.setInstanceName(name);
        c.setPersistConsumerOffsetInterval(persistMs);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.subscribe(topic, "*");
        AtomicBoolean pauseAtNext = new AtomicBoolean();
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            synchronized (out) {
                // Each pull carries the in-memory offset to the broker, which commits it: a member that pulls
                // no more keeps what it consumes from now on uncommitted, however long it lives.
                if (pauseAtNext.getAndSet(false)) {
                    c.suspend();
                    out.println("{\"kind\":\"paused\",\"member\":\"" + name + "\"}");
                }
                for (MessageExt m : msgs) {
                    out.println("{\"kind\":\"consumed\",\"member\":\"" + name + "\",\"key\":\"" + m.getKeys()
                        + "\",\"queue_id\":" + m.getQueueId() + ",\"queue_offset\":" + m.getQueueOffset() + "}");
                }
                out.flush();
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        synchronized (out) {
            out.println("{\"kind\":\"member\",\"member\":\"" + name + "\",\"client_id\":\"" + c.buildMQClientId()
                + "\"}");
            out.flush();
        }
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            if (line.equals("flush") && c.getTraceDispatcher() != null) {
                c.getTraceDispatcher().flush();  // hands every trace context it holds to its sender
                continue;
            }
            if (!line.equals("pause")) {
                throw new IOException("unknown command " + line);
            }
            pauseAtNext.set(true);
        }
        c.shutdown();  // persists its offsets and flushes its trace
    }

    static void tags(String namesrv, PrintWriter out, int count, String topic, String tagsGroup, String okGroup)
            throws Exception {
        DefaultMQProducer p = new DefaultMQProducer("PG_" + tagsGroup, aclHook());
        p.setNamesrvAddr(namesrv);
        p.setInstanceName(tagsGroup);
        p.start();
        for (int i = 0; i < 4; i++) {  // the topic exists before the members subscribe; nobody's tag
            p.send(new Message(topic, "seed", topic + "-seed-" + i, new byte[10]));
        }
        List<String> received = java.util.Collections.synchronizedList(new ArrayList<>());
        List<DefaultMQPushConsumer> members = new ArrayList<>();
        String[][] plan = {{tagsGroup, "t1", "TagA"}, {tagsGroup, "t2", "TagB"}, {okGroup, "ok1", "*"},
                           {okGroup, "ok2", "*"}};
        for (String[] m : plan) {
            DefaultMQPushConsumer c = new DefaultMQPushConsumer(m[0], aclHook());
            c.setNamesrvAddr(namesrv);
            c.setInstanceName(m[0] + "-" + m[1]);
            c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            c.subscribe(topic, m[2]);
            c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                for (MessageExt x : msgs) {
                    received.add("{\"kind\":\"received\",\"group\":\"" + m[0] + "\",\"member\":\"" + m[1]
                        + "\",\"key\":\"" + x.getKeys() + "\",\"queue_id\":" + x.getQueueId()
                        + ",\"queue_offset\":" + x.getQueueOffset() + "}");
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            c.start();
            members.add(c);
            Thread.sleep(1500);  // each subscription newer than the last: the broker keeps the newest
        }
        Thread.sleep(5000);  // the rebalances that follow each join
        synchronized (out) {
            out.println("{\"kind\":\"ready\"}");
            out.flush();
        }
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        int n = 0;
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            if (!line.equals("send")) {
                throw new IOException("expected send, got " + line);
            }
            List<String> sent = new ArrayList<>();
            for (int end = n + count; n < end; n++) {
                String tag = n % 2 == 0 ? "TagA" : "TagB";
                SendResult r = p.send(new Message(topic, tag, topic + "-" + n, new byte[10]));
                sent.add("{\"kind\":\"tagged\",\"key\":\"" + topic + "-" + n + "\",\"tag\":\"" + tag
                    + "\",\"queue_id\":" + r.getMessageQueue().getQueueId() + ",\"queue_offset\":"
                    + r.getQueueOffset() + "}");
            }
            for (String group : new String[] {tagsGroup, okGroup}) {
                awaitDrained(namesrv, group, topic, 60_000);
            }
            synchronized (out) {
                sent.forEach(out::println);
                synchronized (received) {
                    received.forEach(out::println);
                    received.clear();
                }
                out.println("{\"kind\":\"tags_done\"}");
                out.flush();
            }
        }
        for (DefaultMQPushConsumer c : members) {
            c.shutdown();
        }
        p.shutdown();
    }

    static void retry(String namesrv, PrintWriter out, int count, int fail) throws Exception {
        TransactionMQProducer p = new TransactionMQProducer("PG_RETRY", aclHook());
        p.setNamesrvAddr(namesrv);
        p.setInstanceName("retry");
        p.setTransactionListener(new TransactionListener() {
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return LocalTransactionState.COMMIT_MESSAGE;
            }

            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                return LocalTransactionState.COMMIT_MESSAGE;
            }
        });
        p.start();
        List<String> lines = java.util.Collections.synchronizedList(new ArrayList<>());
        Set<String> failing = ConcurrentHashMap.newKeySet();
        failing.add("R-txn");
        for (int i = 0; i < count; i++) {
            SendResult r = p.send(new Message("TopicR", "r", "R-" + i, new byte[10]));
            lines.add("{\"kind\":\"retry_sent\",\"key\":\"R-" + i + "\",\"queue_id\":" + r.getMessageQueue().getQueueId()
                + ",\"queue_offset\":" + r.getQueueOffset() + "}");
            if (i < fail) {
                failing.add("R-" + i);
            }
        }
        SendResult t = p.sendMessageInTransaction(new Message("TopicR", "r", "R-txn", new byte[10]), null);
        lines.add("{\"kind\":\"retry_sent\",\"key\":\"R-txn\",\"transaction_id\":\"" + t.getTransactionId() + "\"}");
        Map<String, Integer> tries = new ConcurrentHashMap<>();
        DefaultMQPushConsumer c = new DefaultMQPushConsumer("CG_RETRY", aclHook());
        c.setNamesrvAddr(namesrv);
        c.setInstanceName("retrier");
        c.setMaxReconsumeTimes(2);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.subscribe("TopicR", "*");
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                tries.merge(m.getKeys(), 1, Integer::sum);
                lines.add("{\"kind\":\"attempt\",\"key\":\"" + m.getKeys() + "\",\"reconsume_times\":"
                    + m.getReconsumeTimes() + ",\"queue_id\":" + m.getQueueId() + "}");
            }
            return failing.contains(msgs.get(0).getKeys()) ? ConsumeConcurrentlyStatus.RECONSUME_LATER
                : ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        long deadline = System.currentTimeMillis() + 120_000;
        while (!failing.stream().allMatch(k -> tries.getOrDefault(k, 0) >= 3)) {
            if (System.currentTimeMillis() > deadline) {
                throw new IOException("the failing messages were not tried 3 times in 120 s: " + tries);
            }
            Thread.sleep(200);
        }
        Thread.sleep(2000);  // the last send-back, to the DLQ
        synchronized (out) {
            lines.forEach(out::println);
            out.println("{\"kind\":\"retried\"}");
            out.flush();
        }
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        while (in.readLine() != null) {
            // until the test has collected
        }
        c.shutdown();
        p.shutdown();
    }

    static void sendPlain(String namesrv, PrintWriter out, String topic, int count, boolean batched) throws Exception {
        DefaultMQProducer p = new DefaultMQProducer("PG_" + topic, aclHook());
        p.setNamesrvAddr(namesrv);
        p.setInstanceName("send-" + topic);
        p.start();
        if (batched) {
            List<MessageQueue> queues = p.fetchPublishMessageQueues(topic);
            int n = 0;
            for (MessageQueue mq : queues) {
                List<Message> batch = new ArrayList<>();
                for (int i = 0; i < count / queues.size(); i++, n++) {
                    batch.add(new Message(topic, "s", topic + "-b" + n, new byte[10]));
                }
                p.send(batch, mq);
            }
        } else {
            for (int i = 0; i < count; i++) {
                p.send(new Message(topic, "s", topic + "-" + i, new byte[10]));
            }
        }
        out.println("{\"kind\":\"sent\",\"topic\":\"" + topic + "\",\"messages\":" + count + "}");
        p.shutdown();
    }

    /** Transactions committed at once, one every 100 ms until stdin closes, to whichever brokers the route names
     *  (refreshed every pollMs); a line per send names the broker that took it. */
    static void produce(String namesrv, PrintWriter out, String topic, int pollMs) throws Exception {
        TransactionMQProducer p = new TransactionMQProducer("PG_CLUSTER", aclHook());
        p.setNamesrvAddr(namesrv);
        p.setInstanceName("cluster-producer");
        p.setPollNameServerInterval(pollMs);
        p.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message m, Object arg) {
                return LocalTransactionState.COMMIT_MESSAGE;
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt m) {
                return LocalTransactionState.COMMIT_MESSAGE;
            }
        });
        p.start();
        AtomicBoolean open = new AtomicBoolean(true);
        Thread stdin = new Thread(() -> {
            try {
                while (System.in.read() >= 0) {
                    // commands are not taken: the phase ends when stdin closes
                }
            } catch (IOException e) {
                // closed
            }
            open.set(false);
        });
        stdin.setDaemon(true);
        stdin.start();
        for (int i = 0; open.get(); i++) {
            try {
                TransactionSendResult r = p.sendMessageInTransaction(new Message(topic, "c", "cluster-" + i, new byte[16]), null);
                out.println("{\"kind\":\"sent\",\"broker_name\":\"" + r.getMessageQueue().getBrokerName()
                    + "\",\"uniq_key\":\"" + r.getMsgId() + "\",\"ts\":" + System.currentTimeMillis() + "}");
            } catch (Exception e) {
                out.println("{\"kind\":\"error\",\"ts\":" + System.currentTimeMillis() + "}");
            }
            out.flush();
            Thread.sleep(100);
        }
        p.shutdown();
    }

    static DefaultMQAdminExt admin(String namesrv) throws Exception {
        DefaultMQAdminExt admin = new DefaultMQAdminExt();
        admin.setNamesrvAddr(namesrv);
        admin.setInstanceName("admin");
        admin.start();
        return admin;
    }

    static Map<MessageQueue, Long> offsets(DefaultMQAdminExt admin) throws Exception {
        ConsumeStats stats = admin.examineConsumeStats(GROUP);
        Map<MessageQueue, Long> out = new TreeMap<>();
        for (Map.Entry<MessageQueue, OffsetWrapper> e : stats.getOffsetTable().entrySet()) {
            out.put(e.getKey(), e.getValue().getConsumerOffset());
        }
        return out;
    }

    static void reset(String namesrv, PrintWriter out, long timestamp) throws Exception {
        DefaultMQAdminExt admin = admin(namesrv);
        Map<MessageQueue, Long> before = offsets(admin);
        admin.resetOffsetByTimestamp(TOPIC, GROUP, timestamp, true);
        Map<MessageQueue, Long> after = offsets(admin);
        for (MessageQueue mq : before.keySet()) {
            out.println("{\"kind\":\"reset\",\"broker_name\":\"" + mq.getBrokerName() + "\",\"consumer_group\":\"" + GROUP
                + "\",\"topic\":\"" + mq.getTopic() + "\",\"queue_id\":" + mq.getQueueId() + ",\"from\":"
                + before.get(mq) + ",\"to\":" + after.get(mq) + "}");
        }
        admin.shutdown();
    }

    static void young(String namesrv, PrintWriter out) throws Exception {
        TransactionMQProducer p = producer(namesrv, "PG_MAIN", "main-young");
        for (int i = 0; i < 5; i++) {
            send(p, "YOUNG", i, "main-young");
        }
        for (Txn t : TXNS.values()) {
            out.println(t.json());
        }
        p.shutdown();
    }

    public static void main(String[] args) throws Exception {
        try (PrintWriter out = new PrintWriter(new FileWriter(args[2], true))) {
            switch (args[0]) {
                case "txn":
                    checkMax = Integer.parseInt(args[3]);
                    checkIntervalMs = Long.parseLong(args[4]);
                    txn(args[1], out);
                    break;
                case "reset":
                    reset(args[1], out, Long.parseLong(args[3]));
                    break;
                case "young":
                    young(args[1], out);
                    break;
                case "bulk":
                    bulk(args[1], out, Integer.parseInt(args[3]));
                    break;
                case "conflict":
                    conflict(args[1], out, Integer.parseInt(args[3]));
                    break;
                case "member":
                    member(args[1], out, args[3], args[4], args[5], Integer.parseInt(args[6]));
                    break;
                case "retry":
                    retry(args[1], out, Integer.parseInt(args[3]), Integer.parseInt(args[4]));
                    break;
                case "tags":
                    tags(args[1], out, Integer.parseInt(args[3]), args.length > 4 ? args[4] : "TopicT",
                         args.length > 4 ? args[5] : "CG_TAGS", args.length > 4 ? args[6] : "CG_OK");
                    break;
                case "send":
                    sendPlain(args[1], out, args[3], Integer.parseInt(args[4]), args.length > 5);
                    break;
                case "produce":
                    produce(args[1], out, args[3], Integer.parseInt(args[4]));
                    break;
                default:
                    throw new IOException("unknown phase " + args[0]);
            }
        }
        System.exit(0);  // the client's non-daemon threads would keep the JVM alive
    }
}
