// Publishes to a delayed exchange with amqplib, as code written for the
// delayed-message-exchange plugin does, and consumes through bindings on the
// routing exchange. The plan comes as JSON on stdin (see amqplib_test.go);
// the result goes to stdout as JSON. Pass or fail is the Go test's call:
// this script only reports what happened, timed by one monotonic clock.
'use strict';

const amqp = require('amqplib');
const { readStdin } = require('./stdin');

// The x-delay header as the plan asks for it: a JS number (amqplib picks
// the smallest signed integer type that holds it), a double, a string,
// void (null), or none.
function delayHeader(m) {
  switch (m.delayType) {
    case 'number': return { 'x-delay': m.delay };
    case 'double': return { 'x-delay': { '!': 'double', value: m.delay } };
    case 'string': return { 'x-delay': String(m.delay) };
    case 'void': return { 'x-delay': null };
    case 'none': return {};
    default: throw new Error(`unknown delayType ${m.delayType}`);
  }
}

const nowNs = () => process.hrtime.bigint();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const plan = JSON.parse(await readStdin());
  const conn = await amqp.connect(plan.url);
  try {
    const ch = await conn.createConfirmChannel();
    const route = `${plan.exchange}.route`;
    const received = [];
    const publishedAt = new Map();
    const returned = [];
    ch.on('return', (msg) => returned.push(msg.properties.messageId));

    // Consumers bind to the routing exchange, as they bound to the
    // plugin's exchange before.
    for (const b of plan.bindings) {
      const q = await ch.assertQueue('', { exclusive: true, autoDelete: true });
      await ch.bindQueue(q.queue, route, b.pattern);
      await ch.consume(q.queue, (msg) => {
        const at = nowNs();
        const id = msg.properties.messageId;
        const h = msg.properties.headers || {};
        const sent = publishedAt.get(id);
        received.push({
          queue: b.name,
          id,
          exchange: msg.fields.exchange,
          routingKey: msg.fields.routingKey,
          body: msg.content.toString('utf8'),
          hasXDelay: Object.hasOwn(h, 'x-delay'),
          xDelay: h['x-delay'] === undefined ? null : h['x-delay'],
          elapsedMs: sent === undefined ? null : Number(at - sent) / 1e6,
        });
      }, { noAck: true });
    }

    // Publishers send to the delayed exchange itself, routing key and
    // x-delay as before, mandatory so that nothing is lost unnoticed.
    for (const m of plan.messages) {
      publishedAt.set(m.id, nowNs());
      ch.publish(plan.exchange, m.routingKey, Buffer.from(m.body, 'utf8'), {
        messageId: m.id,
        persistent: true,
        mandatory: true,
        contentType: 'text/plain',
        headers: { ...delayHeader(m), 'x-test': m.id },
      });
    }
    await ch.waitForConfirms();

    const deadline = Date.now() + plan.waitMs;
    while (received.length < plan.expect && Date.now() < deadline) {
      await sleep(50);
    }
    await sleep(plan.quietMs); // late duplicates
    process.stdout.write(`${JSON.stringify({ received, returned })}\n`);
    await ch.close();
  } finally {
    await conn.close();
  }
}

main().catch((err) => {
  process.stderr.write(`amqplib check: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
