// Drives headless Chromium through the gateway's admin page: the token check and login, the
// list (abandoned first) and the live counts, search, a record's timeline, a hostile key
// rendered inert, the form protection, and both resolutions with their confirmation step.
// Run by ../admin_page.rs, which serves the page over records it made and checks the store
// afterwards. Usage: node drive.mjs BASE_URL TOKEN SCREENSHOT_PATH
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';

const [base, token, screenshot] = process.argv.slice(2);
const hostile = '<script>alert(1)</script>';

const browser = await chromium.launch({
  executablePath: process.env.IDEM_CHROMIUM || '/usr/bin/chromium',
  // Root in CI has no user namespaces for the sandbox.
  args: ['--no-sandbox', '--disable-dev-shm-usage'],
});
let step = 'start';
try {
  // The page must work for reading and acting with JavaScript disabled.
  const context = await browser.newContext({ javaScriptEnabled: false, viewport: { width: 1200, height: 900 } });
  const page = await context.newPage();

  step = 'token check';
  let resp = await page.goto(`${base}/ui`);
  assert.equal(resp.status(), 401, 'the page without a session answers 401');
  assert.equal(await page.locator('#records').count(), 0, 'no records before login');
  const bare = await context.request.get(`${base}/ui/record?key=charge-7`, { maxRedirects: 0 });
  assert.equal(bare.status(), 401, 'a record page without a session answers 401');
  await page.fill('input[name=token]', 'wrong-token');
  await Promise.all([page.waitForLoadState(), page.click('button:has-text("Log in")')]);
  assert.match(await page.textContent('.warn'), /Wrong token/);
  await page.fill('input[name=token]', token);
  await Promise.all([page.waitForURL(`${base}/ui`), page.click('button:has-text("Log in")')]);
  const cookie = (await context.cookies()).find((c) => c.name === 'idem_admin');
  assert.ok(cookie && cookie.httpOnly && cookie.sameSite === 'Strict', 'HttpOnly SameSite=Strict session');
  assert.ok(!cookie.value.includes(token), 'the cookie is not the token');

  step = 'list, abandoned first, and counts';
  const states = await page.locator('#records tbody td:first-child').allTextContents();
  console.log('states in order:', states.join(' '));
  assert.ok(states.length >= 4, `records listed: ${states}`);
  const firstOther = states.findIndex((s) => s !== 'abandoned');
  assert.ok(firstOther >= 2 && states.slice(firstOther).every((s) => s !== 'abandoned'), `abandoned first: ${states}`);
  const frame = page.frameLocator('iframe[title="Live counts"]');
  const executions = Number(await frame.locator('#executions b').textContent());
  const averted = Number(await frame.locator('#averted b').textContent());
  console.log(`counts: executions=${executions} duplicates averted=${averted}`);
  assert.ok(executions >= 3 && averted >= 3, 'counts from the metrics');
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(`screenshot: ${screenshot}`);

  step = 'hostile key rendered inert';
  const keys = await page.locator('#records tbody td:nth-child(2)').allTextContents();
  assert.ok(keys.includes(hostile), `the hostile key shows as text: ${keys}`);
  assert.equal(await page.locator('tbody script').count(), 0, 'no script element from a key');
  // And with JavaScript on, nothing runs: no dialog opens.
  const jsContext = await browser.newContext({ javaScriptEnabled: true });
  await jsContext.addCookies([cookie]);
  const jsPage = await jsContext.newPage();
  let dialogs = 0;
  jsPage.on('dialog', (d) => { dialogs += 1; d.dismiss(); });
  await jsPage.goto(`${base}/ui`);
  await jsPage.goto(`${base}/ui/record?key=${encodeURIComponent(hostile)}`);
  assert.equal(await jsPage.locator('h1 code').textContent(), hostile);
  assert.equal(dialogs, 0, 'a key containing <script> ran no script');
  await jsContext.close();

  step = 'search';
  await page.fill('input[name=key]', 'charge');
  await Promise.all([page.waitForLoadState(), page.click('button:has-text("Search")')]);
  const found = await page.locator('#records tbody td:nth-child(2)').allTextContents();
  assert.deepEqual(found, ['charge-7'], `search by key prefix: ${found}`);
  await page.goto(`${base}/ui?scope=${encodeURIComponent('p:')}&state=completed`);
  const byScope = await page.locator('#records tbody tr').allTextContents();
  assert.ok(byScope.length === 1 && byScope[0].includes('order-1'), `search by scope and state: ${byScope}`);

  step = 'timeline';
  await Promise.all([page.waitForLoadState(), page.click('a:has-text("order-1")')]);
  assert.equal(await page.textContent('#state'), 'completed');
  const timeline = await page.textContent('#timeline');
  assert.match(timeline, /claimed: first lease granted/);
  assert.match(timeline, /completed by the executor/);
  assert.match(timeline, /replayed 2 times/);
  assert.equal(await page.locator('form#release').count(), 0, 'a completed record offers no resolve');

  step = 'form protection';
  const forged = await context.request.post(`${base}/ui/resolve`, {
    form: { scope: '', key: 'charge-7', action: 'release', confirm: 'yes', form_token: 'guessed' },
    maxRedirects: 0,
  });
  assert.equal(forged.status(), 403, 'a post without the form token is refused');

  step = 'resolve: release, with confirmation';
  await page.goto(`${base}/ui/record?key=${encodeURIComponent(hostile)}`);
  assert.equal(await page.textContent('#state'), 'abandoned');
  assert.match(await page.textContent('#timeline'), /abandoned, outcome unknown/);
  await Promise.all([page.waitForLoadState(), page.click('form#release button')]);
  assert.match(await page.textContent('#confirm-what'), /Release this record\?/);
  await Promise.all([page.waitForLoadState(), page.click('form#confirm button')]);
  assert.match(await page.textContent('#done'), /Released/);
  assert.equal(await page.locator('#absent').count(), 1, 'the released record is gone');

  step = 'resolve: store a result, with confirmation';
  await page.goto(`${base}/ui?state=abandoned`);
  await Promise.all([page.waitForLoadState(), page.click('a:has-text("charge-7")')]);
  await page.fill('form#complete input[name=status]', '201');
  await page.fill('form#complete textarea[name=body]', '{"id":"ch_7"}');
  await Promise.all([page.waitForLoadState(), page.click('form#complete button')]);
  assert.match(await page.textContent('#confirm-what'), /Store this result\? .*status 201/);
  await Promise.all([page.waitForLoadState(), page.click('form#confirm button')]);
  assert.match(await page.textContent('#done'), /Result stored/);
  assert.equal(await page.textContent('#state'), 'completed');
  assert.equal(await page.textContent('#status'), '201');
  assert.match(await page.textContent('#timeline'), /resolved by an operator/);

  step = 'log out';
  await Promise.all([page.waitForLoadState(), page.click('button:has-text("Log out")')]);
  resp = await page.goto(`${base}/ui`);
  assert.equal(resp.status(), 401, 'logged out');
  console.log('admin page: every step passed');
} catch (e) {
  console.error(`admin page browser test failed at step "${step}":`, e);
  process.exitCode = 1;
} finally {
  await browser.close();
}
